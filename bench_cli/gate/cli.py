"""`bench gate`'s options and its printed table of checks."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from bench_cli.console import console, print_error

Opt = typer.Option


def gate(
    current: Annotated[str, typer.Argument(help="run or sweep folder (or summary.json) to judge")],
    baseline: Annotated[str | None, Opt(help="run or sweep folder to compare with")] = None,
    max_regression: Annotated[
        list[str] | None, Opt(help="METRIC=PCT%, e.g. output_throughput=5% or ttft_s.p99=10%")
    ] = None,
    ratio: Annotated[
        list[str] | None,
        Opt(
            help="within a sweep: 'output_throughput[batching=continuous]/"
            "output_throughput[batching=static]>=2'"
        ),
    ] = None,
    allow_invalid: Annotated[
        bool, Opt(help="compare runs that flagged themselves INVALID (schedule not kept)")
    ] = False,
) -> None:
    """Judge a run or sweep: against a baseline (--max-regression) and/or by ratios inside
    it (--ratio). Exit 1 if anything fails, 2 on unusable input."""
    from bench_cli.gate.checks import Limit, compare, invalid_labels, noise_note
    from bench_cli.gate.ratio import Ratio
    from bench_cli.gate.results import GateInputError, load_differences, load_results

    try:
        if not max_regression and not ratio:
            raise GateInputError("nothing to check: give --max-regression and/or --ratio")
        if max_regression and baseline is None:
            raise GateInputError("--max-regression needs --baseline")
        checks, judged, warnings = [], [], []
        cur = load_results(current)
        if max_regression:
            limits = [Limit.parse(m) for m in max_regression]
            base = load_results(baseline)  # type: ignore[arg-type]
            checks += compare(cur, base, limits, allow_invalid)
            judged += [base, cur]
            if differ := load_differences(cur, base):
                warnings.append("the two were not given the same load: " + "; ".join(differ))
        if ratio:
            checks += [c for r in ratio for c in Ratio.parse(r).evaluate(cur, allow_invalid)]
            judged.append(cur)
        if allow_invalid and (
            bad := list(dict.fromkeys(w for r in judged for w in invalid_labels(r)))
        ):
            warnings.append("compared although INVALID (--allow-invalid): " + "; ".join(bad))
    except GateInputError as e:
        print_error(console, str(e))
        raise typer.Exit(2) from None
    title = f"gate: {current}" + (f" vs {baseline}" if baseline else "")
    table = Table(title=escape(title))
    for col in ("check", "point", "baseline / bottom", "current / top", "change", "limit", ""):
        table.add_column(col, justify="left" if col in ("check", "point") else "right")
    for c in checks:
        verdict = (
            "[yellow]noise[/]" if c.noise else "[green]pass[/]" if c.passed else "[bold red]FAIL[/]"
        )
        is_ratio = "[" in c.metric
        change = f"x{c.change:.2f}" if is_ratio else f"{c.change:+.1%}"
        table.add_row(
            escape(c.metric),
            escape(c.point),
            _number(c.baseline),
            _number(c.current),
            change if c.change == c.change else "-",  # NaN: no ratio (see the note)
            f"{c.limit:g}" if is_ratio else f"{c.limit * 100:.4g}% worse",
            verdict,
        )
    console.print(table)
    for note in dict.fromkeys(c.note for c in checks if c.note):
        console.print(f"[red]{escape(note)}[/]", highlight=False)
    if any(c.noise for c in checks):
        console.print("[yellow]noise[/]: worse than the limit, but inside both runs' 95% CIs")
    for text in warnings:
        console.print(f"[yellow]warning[/]: {escape(text)}", highlight=False)
    if note := noise_note(judged):
        console.print(f"[yellow]note[/]: {escape(note)}", highlight=False)
    raise typer.Exit(0 if all(c.passed for c in checks) else 1)


def _number(value: float) -> str:
    return "-" if value != value else f"{value:.4g}"  # NaN: not compared (see the note)
