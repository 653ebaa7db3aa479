"""The sweep report opens with a verdict (issue 44): the best setting at each load for the
stated SLO, by how much, whether that beats the run-to-run noise, with the workload and the
SLO written out; "in SLO" always names its SLO; INVALID points are left out of the verdict."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from bench_cli.report.sweep import sweep_report
from bench_cli.sweep.verdict import headline, verdict_lines, workload_text
from tests.cli.test_report import AXES, _sweep_table

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
    assert "<b>SLO:</b> ttft=0.5,tpot=0.05" in head and "SLO: SLO" not in head
    assert workload_text(plan) in head
    assert "in SLO (ttft=0.5,tpot=0.05)" in head
    assert "input 16 tokens" in workload_text(plan) and "8 requests a run" in workload_text(plan)


def _one(rows: list[dict], **keep: object) -> list[dict]:
    return [r for r in rows if all(r[k] == v for k, v in keep.items())]


def test_a_settings_only_sweep_names_the_best_setting_without_a_load() -> None:
    rows = _one(_rows(), rate=4)
    lines = verdict_lines(rows, ["batching"], None, "ttft=1")
    assert len(lines) == 1 and lines[0].best == "batching=continuous"
    assert lines[0].text.startswith("batching=continuous is best by goodput")  # no "at all:"


def test_a_load_only_sweep_has_no_best_setting_but_its_knee_and_peak() -> None:
    kept = _one(_rows(), batching="continuous")  # rates 4 and 16
    rows = [r | {"slo_attainment": a} for r, a in zip(kept, (0.95, 0.5), strict=True)]
    for r in rows:
        del r["batching"]
    lines = verdict_lines(rows, ["rate"], "rate", "ttft=1")
    assert len(lines) == 1 and lines[0].best is None
    text = lines[0].text
    assert "only valid setting" not in text and "point 0" not in text
    assert "no setting to choose between" in text
    assert "highest rate with 90% of requests in SLO: 4" in text
    assert "most goodput (req/s in SLO): 14.4 at rate=16" in text
    plain = verdict_lines(rows, ["rate"], "rate", None)[0].text
    assert "most output tok/s: 640 at rate=16" in plain and "no SLO given" in plain
    # one value on a setting axis is still one setting: named, never "the best"
    named = verdict_lines(_one(_rows(), batching="static"), ["batching", "rate"], "rate", None)
    assert named[0].best is None and "one setting (batching=static) at 2 loads" in named[0].text


def test_a_one_point_sweep_says_what_it_measured_and_that_nothing_compares() -> None:
    row = _one(_rows(slo=True), batching="continuous", rate=4)
    del row[0]["rate"]
    line = verdict_lines(row, ["batching"], None, "ttft=1")[0]
    assert line.best is None
    assert line.text == (
        "one point (batching=continuous): 3.6 goodput (req/s in SLO), 95% of requests in SLO; "
        "nothing to compare it with"
    )


def test_an_all_invalid_sweep_gives_no_verdict() -> None:
    rows = [r | {"invalid_runs": 1} for r in _rows()]
    lines = verdict_lines(rows, ["batching", "rate"], "rate", "ttft=1")
    assert [line.best for line in lines] == [None]
    assert lines[0].text.startswith("no verdict: all 4 points are INVALID")


def test_the_slo_target_sets_the_knee_in_the_verdict() -> None:
    rows = _rows()
    for r in rows:
        r["slo_attainment"] = 0.93 if r["rate"] == 4 else 0.85
    knee90 = verdict_lines(rows, ["batching", "rate"], "rate", "ttft=1")[-1].text
    assert knee90.startswith("highest rate with 90% of requests in SLO") and ": 4;" in knee90
    knee80 = verdict_lines(rows, ["batching", "rate"], "rate", "ttft=1", target=0.8)[-1].text
    assert knee80.startswith("highest rate with 80% of requests in SLO")
    assert "not reached up to 16" in knee80
    knee95 = verdict_lines(rows, ["batching", "rate"], "rate", "ttft=1", target=0.95)[-1].text
    assert "batching=continuous: none" in knee95


def test_the_verdict_opens_with_the_answer_in_one_sentence(tmp_path: Path) -> None:
    lines = verdict_lines(_rows(), ["batching", "rate"], "rate", "ttft=1")
    assert headline(lines) == (
        "best at every load tested: batching=continuous (by goodput (req/s in SLO))"
    )
    rows = _rows()
    _one(rows, batching="static", rate=16)[0]["goodput"] = 100.0  # static wins at rate 16
    mixed = verdict_lines(rows, ["batching", "rate"], "rate", "ttft=1")
    assert headline(mixed) == "the best setting depends on the load: see each line"
    rows = _rows()
    _one(rows, batching="static", rate=4)[0]["invalid_runs"] = 1  # the rival left out there
    alone = headline(verdict_lines(rows, ["batching", "rate"], "rate", "ttft=1"))
    assert alone is not None and "(rate=4: the only valid setting)" in alone, alone
    loads_only = verdict_lines(_one(_rows(), batching="static"), ["batching", "rate"], "rate", None)
    assert headline(loads_only) is None  # nothing was chosen
    pd.DataFrame(_rows(slo=True)).to_csv(tmp_path / "sweep.csv", index=False)
    (tmp_path / "sweep.json").write_text(json.dumps(PLAN))
    page = sweep_report(tmp_path, embed=False).read_text()
    assert page.index("<b>best at every load tested") < page.index("at rate=4:")
