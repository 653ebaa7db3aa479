"""`bench report`: rebuild a run's or a sweep's report from its folder."""

from __future__ import annotations

from pathlib import Path

from bench_cli.report.run import run_report
from bench_cli.report.sweep import sweep_report


def build_report(path: Path, embed: bool = True) -> Path:
    """A run folder or a sweep folder, told apart by what is in it."""
    if (path / "sweep.csv").is_file():
        return sweep_report(path, embed)
    if (path / "summary.json").is_file():
        return run_report(path, embed)
    raise ValueError(f"{path}: neither a run folder (summary.json) nor a sweep (sweep.csv)")
