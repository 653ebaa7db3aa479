"""The sweep report opens with a verdict (issue 44): the best setting at each load for the
stated SLO, by how much, whether that beats the run-to-run noise, with the workload and the
SLO written out; "in SLO" always names its SLO; INVALID points are left out of the verdict."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from bench_cli.report import sweep_report
from bench_cli.sweep_verdict import verdict_lines, workload_text
from tests.test_report import AXES, _sweep_table

PLAN = {
    "axes": AXES,
    "repeat": 1,
    "profile": {"model": "tiny", "input_len": "16", "output_len": "4", "num_requests": 8},
    "flags": {"out": "x"},
}


def _rows(slo: bool = False) -> list[dict]:
    rows = _sweep_table().to_dict("records")
    for r in rows:  # continuous ahead at every rate
        r["goodput"] = r["rate"] * (0.9 if r["batching"] == "continuous" else 0.6)
        r["slo_attainment"] = 0.95 if slo else None
    return rows


def test_the_verdict_names_the_best_setting_per_load_and_the_margin() -> None:
    lines = verdict_lines(_rows(), ["batching", "rate"], "rate", "ttft=1")
    assert [line.best for line in lines[:2]] == ["batching=continuous"] * 2
    assert "+50 %" in lines[0].text and "goodput" in lines[0].text
    assert "one run each: no noise estimate" in lines[0].text
    # without an SLO, best means output tok/s (equal here: the margin says +0 %)
    plain = verdict_lines(_rows(), ["batching", "rate"], "rate", None)
    assert plain[0].metric == "output tok/s" and "+0 %" in plain[0].text


def test_a_margin_inside_the_repeat_spread_is_called_noise() -> None:
    rows = _rows()
    for r in rows:
        r["goodput.ci95"] = 0.5 * r["rate"]  # wider than the gap between the settings
    line = verdict_lines(rows, ["batching", "rate"], "rate", "ttft=1")[0]
    assert "WITHIN run-to-run noise" in line.text
    for r in rows:
        r["goodput.ci95"] = 0.01
    line = verdict_lines(rows, ["batching", "rate"], "rate", "ttft=1")[0]
    assert "beyond run-to-run noise" in line.text


def test_an_invalid_point_is_never_the_verdict() -> None:
    rows = _rows()
    rows[2] |= {"valid": 0.0, "invalid_runs": 1}  # continuous at rate 4
    line = verdict_lines(rows, ["batching", "rate"], "rate", "ttft=1")[0]
    assert line.best == "batching=static" and "INVALID, left out" in line.text


def test_the_sweep_report_leads_with_the_verdict_and_names_the_slo(tmp_path: Path) -> None:
    pd.DataFrame(_rows(slo=True)).to_csv(tmp_path / "sweep.csv", index=False)
    plan = PLAN | {"profile": PLAN["profile"] | {"slo": "ttft=0.5,tpot=0.05"}}
    (tmp_path / "sweep.json").write_text(json.dumps(plan))
    page = sweep_report(tmp_path, embed=False).read_text()
    head = page[: page.index("<script")]
    assert head.index("Verdict") < head.index("<table")  # the answer before the numbers
    assert "SLO ttft=0.5,tpot=0.05" in head and workload_text(plan) in head
    assert "in SLO (ttft=0.5,tpot=0.05)" in head
    assert "input 16 tokens" in workload_text(plan) and "8 requests a run" in workload_text(plan)
