"""`bench profile`'s options and its printed table."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.markup import escape

from bench_cli.console import console
from bench_cli.engine_options import engine_options

Opt = typer.Option


@engine_options(
    (
        "dtype",
        "device",
        "quantization",
        "kv_cache_dtype",
        "enforce_eager",
        "attention_backend",
        "cuda_graphs",
        "block_size",
        "num_kv_blocks",
        "kv_cache_memory_gb",
        "load_format",
    )
)
def profile(
    model: str = "smollm2-135m",
    batch: Annotated[int, Opt(help="sequences decoding in each step")] = 8,
    context: Annotated[int, Opt(help="tokens each decoding sequence holds at the start")] = 128,
    prefill: Annotated[int, Opt(help="prompt tokens of one more request computed per step")] = 0,
    steps: Annotated[int, Opt(help="steps measured in each of the three passes")] = 10,
    warmup: Annotated[int, Opt(help="steps run before each pass, not measured")] = 3,
    out: Annotated[str | None, Opt(help="folder (default results/<time>-profile)")] = None,
    compare: Annotated[
        str | None, Opt(help="an earlier profile (folder or profile.json) to show beside")
    ] = None,
    *,
    engine: dict[str, Any],
) -> None:
    """Where an engine step's time goes: steps of one shape (decodes at a context, optionally
    beside a prefill chunk) timed by category (linears, attention, norms and activations, LM
    head, sampling, scheduling, input preparation, detokenization, the engine's Python) against
    this device's measured matmul and read peaks, with the memory floor of the step; writes
    trace.json (torch profiler, opens in Perfetto) and profile.json."""
    from bench_cli.profile.analyse import run_profile
    from bench_cli.profile.capture import ProfileError, Shape
    from bench_cli.profile.render import load_report, render

    shape = Shape(batch, context, prefill, steps, warmup)
    options = engine
    try:
        before = load_report(compare) if compare else None  # a bad path fails before the run
        report = run_profile(model, shape, options, out)
    except (ProfileError, ValueError) as e:
        console.print(f"[red]bench profile: {escape(str(e))}[/red]")
        raise typer.Exit(2) from None
    table, lines = render(report, before)
    console.print(table)
    for line in lines:
        console.print(line)
    console.print(f"trace: {report['trace']} (open in Perfetto or chrome://tracing)")
