"""`bench claims`'s options; the claims are claims/runner.py's."""

from __future__ import annotations

from typing import Annotated

import typer

from bench_cli.console import console
from bench_cli.sim_options import (
    EngineKind,
    SimCostModel,
    SimDevice,
    SimProfile,
)

Opt = typer.Option


def claims(
    quick: Annotated[
        bool,
        Opt("--quick", help="the tiny random model and small loads: tests the machinery (~5 min)"),
    ] = False,
    only: Annotated[str | None, Opt(help="claims to run by id or number, e.g. 1,3,7b")] = None,
    model: Annotated[
        str | None, Opt(help="bundled model (default smollm2-135m; quick: tiny)")
    ] = None,
    base_url: Annotated[
        str | None, Opt(help="a server for the claims about servers (4); the rest need ours")
    ] = None,
    out: Annotated[str | None, Opt(help="claims folder (default results/<time>-claims)")] = None,
    resume: Annotated[str | None, Opt(help="a claims folder: skip its finished claims")] = None,
    no_dashboard: Annotated[bool, Opt("--no-dashboard", help="no live progress display")] = False,
    max_p99_lag_ms: Annotated[
        float | None,
        Opt(help="p99 schedule lag above which a run is INVALID (default 10; a busy machine)"),
    ] = None,
    engine: EngineKind = None,
    sim_device: SimDevice = None,
    sim_cost_model: SimCostModel = None,
    sim_profile: SimProfile = None,
    tensor_parallel_size: Annotated[
        int, Opt(help="sim: GPUs the simulated model is split over")
    ] = 1,
) -> None:
    """Measure the serving folklore on this machine: paging, continuous batching, chunked
    prefill, the engine vs naive serving, FP8, fused kernels, sharing and priority. Each claim
    is an ordinary sweep in its own folder; prints claim, what the brief says, what was
    measured and a verdict, and writes claims.json and claims.html. With --engine sim, the
    claims a simulation can show, predicted for any model and device, in minutes; their
    arrival rates scaled to that model and device's speed."""
    from bench_cli.claims.runner import SimFlags, run_claims

    sim = SimFlags(engine, sim_device, sim_cost_model, sim_profile, tensor_parallel_size)
    code = run_claims(
        only, quick, model, base_url, out, resume, not no_dashboard, console, sim, max_p99_lag_ms
    )
    raise typer.Exit(code)
