"""The sweep's Pareto view (issue 44): tok/s per user against tok/s, its frontier computed on
hand-made points, drawn in the sweep report and by `bench report --pareto`."""

from __future__ import annotations

import json
import math
from pathlib import Path

from typer.testing import CliRunner

from bench_cli.app import app
from bench_cli.report.sweep import sweep_report
from bench_cli.sweep.pareto import frontier, frontier_rows
from tests.cli.test_report import AXES, _sweep_table


def test_the_frontier_keeps_only_points_nothing_beats_on_both() -> None:
    points = [(10, 100), (20, 90), (15, 80), (30, 40), (5, 100), (30, 30), (25, math.nan)]
    # (15, 80) is beaten by (20, 90); (5, 100) tied on y by (10, 100) with a higher x;
    # (30, 30) by (30, 40); a missing coordinate never counts
    assert frontier(points) == [0, 1, 3]
    assert frontier([]) == [] and frontier([(1.0, 1.0)]) == [0]
    assert frontier([(1, 1), (1, 1)]) == [0]  # a duplicate is one point of the frontier


def test_an_invalid_point_is_never_on_the_frontier() -> None:
    table = _sweep_table()  # TPOT grows with the point: static beats continuous at each rate
    on = [(r["batching"], r["rate"]) for r in frontier_rows(table, ["batching", "rate"])]
    assert on == [("static", 16), ("static", 4)]
    table["valid"] = [1.0, 0.0, 1.0, 1.0]  # static at 16 did not keep its schedule
    table["invalid_runs"] = [0, 1, 0, 0]
    on = [(r["batching"], r["rate"]) for r in frontier_rows(table, ["batching", "rate"])]
    assert on == [("continuous", 16), ("static", 4)]


def _sweep_dir(tmp: Path) -> Path:
    _sweep_table().to_csv(tmp / "sweep.csv", index=False)
    (tmp / "sweep.json").write_text(json.dumps({"axes": AXES, "repeat": 1}))
    return tmp


def test_the_sweep_report_and_bench_report_pareto_draw_the_chart(tmp_path: Path) -> None:
    page = sweep_report(_sweep_dir(tmp_path), embed=False).read_text()
    assert "Pareto frontier" in page and "Pareto: per-user speed" in page
    result = CliRunner().invoke(app, ["report", "--pareto", "--cdn", str(tmp_path)])
    assert result.exit_code == 0, result.output
    pareto = (tmp_path / "pareto.html").read_text()
    assert "Pareto frontier" in pareto and "On the Pareto frontier" in pareto
    bad = CliRunner().invoke(app, ["report", "--pareto", str(tmp_path / "nowhere")])
    assert bad.exit_code == 2 and "sweep folder" in bad.output
