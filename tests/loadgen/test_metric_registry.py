"""The metric registry is the one home of a metric: what it declares reaches summary.json,
summary.csv, sweep.csv, the gate and the docs' reference, and nothing a summary holds is
left undeclared."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pandas as pd
import pytest

from bench_cli.export import write_summary
from bench_cli.gate.checks import Limit, compare, direction
from bench_cli.gate.results import load_results
from bench_cli.sweep.grid import SweepPoint
from bench_cli.sweep.row import aggregate
from loadgen import metric_registry
from loadgen.arrivals import Arrivals
from loadgen.metric_registry import NOT_METRICS, Metric
from loadgen.metrics import SLO, summarize
from loadgen.records import RequestRecord
from scripts.docgen.metrics_ref import metrics_page


def records(n: int = 24, tokens_per_chunk: int = 1) -> list[RequestRecord]:
    out = []
    for i in range(n):
        t = i / 10
        chunks = [t + 0.05 * k for k in (1, 2, 3)]
        out.append(
            RequestRecord(
                i,
                str(i),
                8,
                3 * tokens_per_chunk,
                scheduled_s=t,
                send_s=t,
                first_chunk_s=chunks[0],
                end_s=chunks[-1],
                chunk_s=chunks,
                chunk_tokens=[tokens_per_chunk] * 3,
                prompt_tokens=9,
                prompt_tokens_added=1,
                cached_tokens=4,
                output_tokens=3 * tokens_per_chunk,
                status="ok",
            )
        )
    return out


def full_summary() -> dict:
    """A summary with every optional part: arrivals, multi-token chunks, an SLO, cache use."""
    arrivals = Arrivals("poisson", rate=10.0, seed=0)
    return summarize(records(tokens_per_chunk=2), 2.5, arrivals, SLO(ttft=1.0))


def test_every_summary_key_is_a_declared_metric_or_context() -> None:
    summary = full_summary()
    undeclared = [k for k in summary if k not in NOT_METRICS and not metric_registry.metric(k)]
    assert not undeclared
    declared = metric_registry.of_kind("distribution", "scalar", "detail")
    assert not [m.name for m in declared if m.name not in summary]  # no stale entry


def test_summary_definitions_come_from_the_registry() -> None:
    defs = summarize(records(), 2.5)["definitions"]
    assert defs["tpot"] == metric_registry.METRICS["tpot_s"].definition
    assert defs["duration"] == metric_registry.METRICS["duration_s"].definition


def test_peak_output_throughput_reaches_sweep_csv_and_the_gate() -> None:
    row = aggregate(SweepPoint(0, {"rate": 1.0}, {}), [full_summary()])
    assert row["peak_output_throughput"] > 0 and "peak_concurrent_requests" in row
    assert direction("peak_output_throughput") == 1
    assert Limit.parse("peak_output_throughput=5%").metric == "peak_output_throughput"


def test_a_metric_without_a_direction_is_refused_by_the_gate_with_the_reason() -> None:
    from bench_cli.gate.results import GateInputError

    with pytest.raises(GateInputError, match="neither higher nor lower"):
        direction("total_output_tokens")
    with pytest.raises(GateInputError, match="name a statistic"):
        direction("ttft_s")


def test_summary_csv_names_units_and_keeps_types(tmp_path: Path) -> None:
    summary = full_summary() | {"telemetry": {"preemptions": 2.0, "notes": ["a", "b"]}}
    write_summary(tmp_path, summary)
    header, values = list(csv.reader((tmp_path / "summary.csv").open()))
    row = dict(zip(header, values, strict=True))
    assert "output_throughput" not in row and float(row["output_throughput_tok_per_s"]) > 0
    assert row["request_throughput_req_per_s"] and row["goodput_req_per_s"]
    assert row["completed"] == "24" and row["telemetry.preemptions"] == "2"  # counts as ints
    assert row["valid"] in ("True", "False")
    assert json.loads(row["telemetry.notes"]) == ["a", "b"]  # JSON, not a Python repr
    # summary.json keeps its keys
    assert "output_throughput" in json.loads((tmp_path / "summary.json").read_text())


def test_a_toy_metric_declared_once_reaches_every_surface(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    toy = Metric(
        "toy_tokens_per_request",
        "tokens",
        "higher",
        "output tokens / completed requests",
        compute=lambda ok, _duration: sum(r.output_tokens for r in ok) / max(len(ok), 1),
    )
    monkeypatch.setitem(metric_registry.METRICS, toy.name, toy)
    summary = summarize(records(), 2.5)
    assert summary[toy.name] == 3.0
    assert summary["definitions"][toy.name] == toy.definition
    # a run's files and the gate reading them
    base, cur = tmp_path / "base", tmp_path / "cur"
    for path, factor in ((base, 1.0), (cur, 0.8)):
        path.mkdir()
        write_summary(path, summary | {toy.name: summary[toy.name] * factor})
    assert json.loads((cur / "summary.json").read_text())[toy.name] == pytest.approx(2.4)
    assert "toy_tokens_per_request" in (cur / "summary.csv").read_text()
    limit = Limit.parse(f"{toy.name}=10%")
    (checked,) = compare(load_results(cur), load_results(base), [limit])
    assert not checked.passed  # 20 % fewer: worse in the declared direction
    # sweep.csv
    row = aggregate(SweepPoint(0, {"rate": 1.0}, {}), [summary])
    assert row[toy.name] == 3.0
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    pd.DataFrame([row]).to_csv(sweep / "sweep.csv", index=False)
    (sweep / "sweep.json").write_text(json.dumps({"axes": {"rate": [1.0]}}))
    (checked,) = compare(load_results(sweep), load_results(sweep), [limit])
    assert checked.passed and checked.current == 3.0
    # the docs' metric reference
    assert f"| `{toy.name}` | tokens | higher | {toy.definition} |" in metrics_page()


def test_repeats_of_summaries_without_a_newer_metric_aggregate_to_empty_cells() -> None:
    old = {k: v for k, v in summarize(records(), 2.5).items() if k != "peak_output_throughput"}
    row = aggregate(SweepPoint(0, {"rate": 1.0}, {}), [old, old])
    assert row["peak_output_throughput"] is None
    assert row["completed.ci95"] == 0.0
