"""`bench report`: its options, and which report a folder gets (a run's or a sweep's)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from bench_cli.console import console, print_error


def build_report(path: Path, embed: bool = True) -> Path:
    """A run folder or a sweep folder, told apart by what is in it. (The drawing modules are
    imported here: plotly and pandas are not for every command's start-up.)"""
    if (path / "sweep.csv").is_file():
        from bench_cli.report.sweep import sweep_report

        return sweep_report(path, embed)
    if (path / "summary.json").is_file():
        from bench_cli.report.run import run_report

        return run_report(path, embed)
    raise ValueError(f"{path}: neither a run folder (summary.json) nor a sweep (sweep.csv)")


Opt = typer.Option


def report(
    folder: Annotated[str, typer.Argument(help="a run folder or a sweep folder")],
    cdn: Annotated[
        bool, Opt(help="load plotly.js from its CDN (small file, needs internet)")
    ] = False,
    pareto: Annotated[
        bool,
        Opt(help="a sweep: pareto.html, tok/s per user against tok/s, the frontier's points"),
    ] = False,
) -> None:
    """Rebuild report.html (plotly) from a run's or a sweep's files on disk."""
    from pathlib import Path

    from bench_cli.report.cli import build_report

    try:
        if pareto:
            from bench_cli.report.sweep import pareto_report

            if not (Path(folder) / "sweep.csv").is_file():
                raise ValueError(f"{folder}: --pareto takes a sweep folder (sweep.csv)")
            path = pareto_report(Path(folder), embed=not cdn)
        else:
            path = build_report(Path(folder), embed=not cdn)
    except (ValueError, OSError) as e:
        print_error(console, str(e))
        raise typer.Exit(2) from None
    console.print(f"wrote {escape(str(path))}", highlight=False, soft_wrap=True)
