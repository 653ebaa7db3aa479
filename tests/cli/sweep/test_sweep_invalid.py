"""A sweep point whose run flagged itself INVALID (schedule not kept) is marked as such
wherever the sweep is shown: sweep.csv, the terminal table, report.html (issue 41 item 20)."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pandas as pd
from rich.console import Console

from bench_cli.report.sweep import sweep_report
from bench_cli.sweep.grid import grid
from bench_cli.sweep.row import aggregate
from bench_cli.sweep.table import knee, print_comparison
from tests.cli.sweep.test_sweep_gate import _summary
from tests.cli.test_report import AXES, _sweep_table


def test_sweep_csv_counts_a_points_invalid_runs() -> None:
    point = grid({"rate": [4]})[0]
    row = aggregate(point, [_summary(valid=True), _summary(valid=False), _summary(valid=False)])
    assert row["invalid_runs"] == 2 and row["valid"] == 1 / 3
    assert aggregate(point, [_summary()])["invalid_runs"] == 0


def _rows() -> list[dict]:
    rows = _sweep_table().to_dict("records")
    for i, row in enumerate(rows):
        row |= {"valid": 0.0 if i == 1 else 1.0, "invalid_runs": int(i == 1)}
    return rows


def test_the_terminal_table_marks_invalid_points() -> None:
    buf = io.StringIO()
    rows = _rows()
    print_comparison(Console(file=buf, width=200), rows, list(AXES), ["rate"])
    text = buf.getvalue()
    invalid = rows[1]
    line = next(x for x in text.splitlines() if "INVALID" in x)
    assert str(invalid["batching"]) in line
    assert text.count("INVALID") == 2  # the row, and the line saying what it means
    assert "could not keep to its schedule" in text


def test_the_sweep_report_marks_invalid_points(tmp_path: Path) -> None:
    pd.DataFrame(_rows()).to_csv(tmp_path / "sweep.csv", index=False)
    (tmp_path / "sweep.json").write_text(json.dumps({"axes": AXES, "repeat": 1}))
    page = sweep_report(tmp_path, embed=False).read_text()
    head = page[: page.index("<script")]
    assert "INVALID" in head and "could not keep to its schedule" in head
    assert head.count(">INVALID<") == 1  # the table's cell of that point


def test_an_slo_knee_at_an_invalid_point_says_so() -> None:
    from bench_cli.sweep.table import knee

    def row(rate: float, attainment: float, valid: float = 1.0) -> dict:
        return {"rate": rate, "slo_attainment": attainment, "valid": valid}

    assert knee([row(1, 0.99), row(2, 0.95, 0.0), row(4, 0.5)], "rate") == "2 (INVALID)"
    assert knee([row(1, 0.99), row(2, 0.95)], "rate") == "not reached up to 2"
    assert knee([row(1, 0.99), row(2, 0.95, 0.0)], "rate") == "not reached up to 2 (INVALID)"


def test_a_knee_over_attainment_that_rises_with_the_load_is_doubtful() -> None:
    def row(rate: float, attainment: float, sent: int = 40, **more: float) -> dict[str, Any]:
        return {"rate": rate, "slo_attainment": attainment, "completed": sent, "failed": 0} | more

    # 40 requests a point: 50 % at rate 2 then 95 % at rate 4 is no sampling accident
    rose = knee([row(1, 0.95), row(2, 0.5), row(4, 0.95), row(8, 0.2)], "rate")
    assert rose.startswith("4 (DOUBTFUL: in SLO rose with the load, 50% at rate=2 to 95%")
    # 4 requests a point: one request more in SLO is within noise, the knee stands
    few = [row(1, 0.95, 4), row(2, 0.5, 4), row(4, 0.75, 4), row(8, 0.2, 4)]
    assert knee(few, "rate") == "1"
    # repeats: overlapping 95 % intervals are noise, apart ones are not
    spread = {"slo_attainment.ci95": 0.3}
    assert knee([row(1, 0.95), row(2, 0.5, **spread), row(4, 0.85, **spread)], "rate") == "1"
    tight = {"slo_attainment.ci95": 0.01}
    assert "DOUBTFUL" in knee([row(2, 0.5, **tight), row(4, 0.95, **tight)], "rate")


def test_a_knee_above_a_load_that_was_not_served_says_so() -> None:
    def row(rate: float, attainment: float) -> dict[str, Any]:
        return {"rate": rate, "slo_attainment": attainment, "completed": 12, "failed": 0}

    # 12 requests a point: 75 % then 92 % is within noise, but "served up to 20" is untrue
    assert knee([row(5, 0.75), row(20, 0.92), row(40, 0.3)], "rate") == (
        "20 (not served at rate=5 below it)"
    )
