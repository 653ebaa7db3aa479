"""`bench calibrate`'s options; the fit is calibrate/fit.py's."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from bench_cli.console import console
from bench_cli.engine_options import engine_options

Opt = typer.Option


@engine_options(
    (
        "dtype",
        "quantization",
        "kv_cache_dtype",
        "enforce_eager",
        "attention_backend",
        "tensor_parallel_size",
        "max_num_seqs",
    ),
    unset=True,
    prefix="engine: ",
)
def calibrate(
    model: Annotated[str, Opt(help="bundled model to measure")] = "smollm2-135m",
    from_run: Annotated[
        list[str] | None,
        Opt(help="fit to an earlier real run's steps (its folder; repeatable) instead of a load"),
    ] = None,
    out: Annotated[str | None, Opt(help="profile path (default: where --engine sim looks)")] = None,
    num_requests: Annotated[
        int | None,
        Opt(help="requests of each phase of the calibration load (profiles/calibrate.toml)"),
    ] = None,
    *,
    engine: dict[str, Any],
) -> None:
    """Fit the simulated engine's step times to this machine: run a load ramping past
    saturation on the real engine (or read --from-run folders), fit step time to the steps'
    shapes, and save the profile `bench run --engine sim` uses for this model and settings."""
    from bench_cli.calibrate.fit import calibrate as run_calibrate

    raise typer.Exit(run_calibrate(model, engine, from_run or [], out, num_requests, console))
