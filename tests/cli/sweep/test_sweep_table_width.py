"""The sweep's closing table at 100 columns never cuts a number (issue 45): with every
column present and repeats' ±CI, rich would squeeze cells to "12…"; columns that do not fit
go to a second table instead."""

from __future__ import annotations

import io
from typing import Any

import pytest
from rich.console import Console

from bench_cli.sweep.table import COLUMNS, print_comparison


def _row(setting: str, rate: float, k: float) -> dict[str, Any]:
    row: dict[str, Any] = {"point": 0, "batching": setting, "max_num_seqs": 256, "rate": rate}
    for _, key, *_ in COLUMNS:
        row[key] = 1234.5678 * k
        row[f"{key}.ci95"] = 12.345 * k
    row |= {"slo_attainment": 0.95, "telemetry.prefix_cache_hit_rate": 0.5}
    row |= {"telemetry.spec_acceptance_rate": 0.75}
    return row


@pytest.mark.parametrize("n", [1, 2, 3])
def test_every_number_is_printed_whole_at_100_columns(n: int) -> None:
    points = [("continuous", 16.0), ("static", 16.0), ("continuous", 64.0)][:n]
    rows = [_row(s, r, k) for k, (s, r) in enumerate(points, start=1)]
    buf = io.StringIO()
    console = Console(file=buf, width=100, force_terminal=False, color_system=None)
    print_comparison(console, rows, ["batching", "max_num_seqs", "rate"], ["rate"])
    out = buf.getvalue()
    assert "…" not in out, out
    assert max(len(line) for line in out.splitlines()) <= 100, out
    for row in rows:
        for _, key, scale, fmt in COLUMNS:
            ci = fmt.format(row[f"{key}.ci95"] * scale).rstrip("%")
            assert f"{fmt.format(row[key] * scale)} ±{ci}" in out, out
