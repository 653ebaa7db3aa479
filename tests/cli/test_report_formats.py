"""A run report a newcomer can read (issue 45): throughput as 2,110 tok/s, not 2.11e+03; no
"-0.00" lag; no panel drawn without data."""

from __future__ import annotations

import json
from pathlib import Path

from bench_cli.report.page import has_data
from bench_cli.report.page import ms as _ms
from bench_cli.report.page import number as _number
from bench_cli.report.run import latency_figure, run_report, throughput_figure, timeline_figure
from loadgen.records import RequestRecord
from tests.cli.test_report import _run_folder


def _one_token_records() -> list[RequestRecord]:
    """Requests that each streamed a single token: no TPOT, no ITL."""
    return [
        RequestRecord(index=i, request_id=f"r{i}", input_len=8, output_len=1, send_s=0.1 * i,
                      first_chunk_s=0.1 * i + 0.02, end_s=0.1 * i + 0.02,
                      chunk_s=[0.1 * i + 0.02], chunk_tokens=[1], output_tokens=1, status="ok")
        for i in range(4)
    ]  # fmt: skip


def _titles(fig: object) -> list[str]:
    return [a.text for a in fig.layout.annotations]  # type: ignore[attr-defined]


def test_numbers_have_thousands_separators_and_no_negative_zero() -> None:
    assert _number(2110.5) == "2,110" and _number(2110.0) == "2,110"
    assert _number(12.345) == "12.3" and _number(16) == "16"
    assert _ms(-1e-7) == "0.00" and _ms(-0.0) == "0.00" and _ms(-0.002) == "-2.00"


def test_panels_without_data_are_left_out() -> None:
    recs = _one_token_records()
    assert _titles(latency_figure(recs)) == ["TTFT", "E2E latency"]
    failed = [RequestRecord(index=0, request_id="x", input_len=8, output_len=4, send_s=0.0,
                            end_s=0.1, status="error")]  # fmt: skip
    titles = _titles(throughput_figure(failed, None))
    assert "output tokens/s" not in titles and "requests in flight" not in titles
    assert not has_data(throughput_figure(failed, None)) and not has_data(timeline_figure([]))
    assert has_data(latency_figure(recs))


def test_run_report_axes_and_table_print_whole_numbers(tmp_path: Path) -> None:
    run = _run_folder(tmp_path)
    summary = json.loads((run / "summary.json").read_text())
    summary |= {"output_throughput": 2110.5, "total_token_throughput": 12345.6}
    summary["schedule_lag_s"] = {"mean": -1e-7, "p50": -0.0, "p90": 0.0, "p99": 0.0, "count": 6}
    (run / "summary.json").write_text(json.dumps(summary))
    page = run_report(run, embed=False).read_text()
    head = page[: page.index("<script")]
    assert ">2,110<" in head and "e+03" not in head and "-0.00" not in head
    assert '"tickformat":",~f"' in page.replace(" ", "")  # plotly ticks: 2,110 not 2.11k
    assert '"hoverformat":",.6~g"' in page.replace(" ", "")


def test_telemetry_series_zero_for_the_whole_run_are_left_out() -> None:
    """A run without speculation scrapes spec-decode counters that stay 0: no legend entry,
    no panel (the live view hides the same rows)."""
    import pandas as pd

    timeline = pd.DataFrame(
        {
            "t_s": [0.0, 0.1, 0.2],
            "server_cpu_percent": [50.0, 80.0, 0.0],
            "engine_waiting": [0.0, 2.0, 0.0],
            "engine_spec_drafts": [0.0, 0.0, 0.0],
            "engine_spec_accepted_tokens": [float("nan"), 0.0, float("nan")],
        }
    )
    fig = throughput_figure(_one_token_records(), timeline)
    names = [t.name for t in fig.data]
    assert "server CPU (% (100 = one core))" in names and "engine waiting (requests)" in names
    assert not [n for n in names if "spec" in n]
    assert not [t for t in _titles(fig) if "spec" in t]
