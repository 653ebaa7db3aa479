"""`bench sweep`'s options; the sweep itself is sweep/runner.py's."""

from __future__ import annotations

from typing import Annotated

import typer

from bench_cli.console import console
from bench_cli.sim_options import (
    EngineKind,
    SimAcceptance,
    SimCostModel,
    SimDevice,
    SimDraftShare,
    SimProfile,
)

Opt = typer.Option


def sweep(
    profile: Annotated[
        str | None,
        Opt(help="sweep profile: a run profile with a [sweep] table (with --rates: any profile)"),
    ] = None,
    rates: Annotated[
        str | None,
        Opt(
            help="the load axis: rates such as 1,2,4 (replace the profile's), or auto:N as "
            "guidellm's sweep: a synchronous run (concurrency 1), a throughput run (every "
            "request at once) and N-2 rates spaced linearly between their achieved req/s"
        ),
    ] = None,
    base_url: Annotated[
        str | None,
        Opt(help="sweep the load against an external server (with --serve-cmd: where it listens)"),
    ] = None,
    slo_search: Annotated[
        str | None,
        Opt(
            help="LO:HI[:STEPS]: per setting, the highest rate with --slo-target of requests "
            "in the profile's SLO, by bisection between LO and HI req/s (STEPS midpoints, "
            "default 5)"
        ),
    ] = None,
    slo_target: Annotated[
        float | None,
        Opt(
            help="share of requests in SLO that makes a load served, 0 < x <= 1 (default 0.9): "
            "the SLO knee, --slo-search and the verdict use it"
        ),
    ] = None,
    serve_cmd: Annotated[
        str | None,
        Opt(
            help="start this server for every run, e.g. 'vllm serve M --max-num-seqs "
            "{max_num_seqs}': {KEY} filled from the sweep's grid, {port} with a free port; "
            "its output in the point's server.log; stopped (its process group) after the run"
        ),
    ] = None,
    ready_url: Annotated[
        str | None,
        Opt(help="with --serve-cmd: ready when this answers 200 (default /health, /v1/models)"),
    ] = None,
    ready_timeout: Annotated[
        float, Opt(help="with --serve-cmd: seconds to wait for the server to be ready")
    ] = 600.0,
    after_point_cmd: Annotated[
        str | None, Opt(help="with --serve-cmd: a shell command run after each point's runs")
    ] = None,
    model: Annotated[str | None, Opt(help="served model name or bundled model")] = None,
    api_key: Annotated[str | None, Opt(help="bearer token for the server")] = None,
    num_requests: Annotated[
        int | None, Opt(help="requests a point (replaces the profile's; not with a sweep axis)")
    ] = None,
    duration: Annotated[
        float | None, Opt(help="stop sending after S seconds a point (as --num-requests)")
    ] = None,
    rate: Annotated[
        float | None,
        Opt(
            help="one request rate for every point (refused where rate is an axis: "
            "--rates replaces the axis)"
        ),
    ] = None,
    repeat: Annotated[int, Opt(help="runs per point (fresh server each): mean, std, 95% CI")] = 1,
    ray_address: Annotated[
        str | None,
        Opt(
            help="run the points at once as Ray tasks on this cluster (ADDR, or local): a CPU "
            "for each load process, a GPU for a point's server where the cluster has GPUs"
        ),
    ] = None,
    resume: Annotated[str | None, Opt(help="a sweep folder: skip its finished points")] = None,
    name: Annotated[str | None, Opt(help="sweep name (in the folder name)")] = None,
    out: Annotated[str | None, Opt(help="sweep folder (default results/<time>-<name>)")] = None,
    no_dashboard: Annotated[bool, Opt("--no-dashboard", help="no live progress display")] = False,
    engine_kind: EngineKind = None,
    sim_device: SimDevice = None,
    sim_cost_model: SimCostModel = None,
    sim_profile: SimProfile = None,
    sim_acceptance: SimAcceptance = None,
    sim_draft_share: SimDraftShare = None,
) -> None:
    """Run one load list against a grid of engine settings, a fresh server per point; writes
    sweep.csv and prints which setting is best at each load. `--rates auto:N` finds the loads
    itself (`bench sweep --base-url URL --rates auto:10`: the default profile's requests)."""
    from bench_cli.sweep.options import SweepOptions
    from bench_cli.sweep.runner import run_sweep

    if repeat < 1:
        console.print("[bold red]error:[/] --repeat must be >= 1")
        raise typer.Exit(2)
    if profile is None and rates is None and slo_search is None:
        console.print("[bold red]error:[/] give --profile (a sweep profile) and/or --rates")
        raise typer.Exit(2)
    serve = None
    if serve_cmd is not None:
        from bench_cli.sweep.serve_cmd import ServeCommand

        serve = ServeCommand(serve_cmd, base_url, ready_url, ready_timeout, after_point_cmd)
    elif ready_url is not None or after_point_cmd is not None:
        console.print("[bold red]error:[/] --ready-url and --after-point-cmd go with --serve-cmd")
        raise typer.Exit(2)
    flags = {"base_url": base_url, "model": model, "api_key": api_key, "name": name, "out": out}
    flags |= {"engine_kind": engine_kind, "sim_device": sim_device}
    flags |= {"sim_cost_model": sim_cost_model, "sim_profile": sim_profile}
    flags |= {"sim_acceptance": sim_acceptance, "sim_draft_share": sim_draft_share}
    flags |= {"num_requests": num_requests, "duration": duration, "rate": rate}
    options = SweepOptions(
        repeat=repeat,
        resume=resume,
        dashboard=not no_dashboard,
        rates=rates,
        serve=serve,
        search=slo_search,
        target=slo_target,
        ray_address=ray_address,
    )
    code = run_sweep(profile or "default", flags, options, console)
    raise typer.Exit(code)
