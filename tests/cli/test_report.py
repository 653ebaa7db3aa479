"""The HTML reports as a reader sees them: a setting keeps one colour and one legend entry in
every panel of a sweep; a run's telemetry has an axis per unit; tables and plots speak ms."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from bench_cli.report.page import setting_colours
from bench_cli.report.run import run_report, throughput_figure
from bench_cli.report.sweep import sweep_figures, sweep_report
from bench_cli.signals import Signal, signal
from loadgen.records import RequestRecord

SETTINGS = ("static", "continuous")
AXES = {"batching": list(SETTINGS), "rate": [4, 16]}


def _dist(ms: float) -> dict[str, Any]:
    s = ms / 1e3
    return {"mean": s * 1.1, "p50": s, "p90": s * 1.5, "p99": s * 2, "max": s * 3, "count": 8}


def _sweep_table() -> pd.DataFrame:
    rows = []
    for i, (batching, rate) in enumerate((b, r) for b in SETTINGS for r in AXES["rate"]):
        row: dict[str, Any] = {"point": i, "batching": batching, "rate": rate, "runs": 1}
        for key in ("ttft_s", "itl_s", "tpot_s", "e2e_s"):
            row |= {f"{key}.{stat}": v for stat, v in _dist(20.0 + i).items() if stat != "count"}
        row |= {"output_throughput": 40.0 * rate, "goodput": rate * 0.9, "completed": 8}
        row |= {"request_throughput": rate * 0.95, "telemetry.mean_engine_running": 1.0 + i}
        rows.append(row)
    return pd.DataFrame(rows)


def _colour_of(trace: Any) -> Any:
    if getattr(trace, "type", "") == "bar":
        return trace.marker.color
    return trace.line.color if trace.line.color is not None else trace.marker.color


def test_a_setting_has_one_colour_and_one_legend_entry_in_every_sweep_panel() -> None:
    table = _sweep_table()
    colours = setting_colours(table["batching"])
    assert len(set(colours.values())) == len(SETTINGS)
    figs = sweep_figures(table, ["batching", "rate"], "rate", ["batching"])
    assert len(figs) == 4  # throughput vs latency, Pareto, against rate, side by side
    for fig in figs:
        shown: list[str] = []
        for trace in fig.data:
            if trace.legendgroup in SETTINGS:
                assert trace.name == trace.legendgroup
                assert _colour_of(trace) == colours[trace.name], (fig.layout.title.text, trace)
                if trace.showlegend is not False:
                    shown.append(trace.name)
        assert sorted(shown) == sorted(SETTINGS), fig.layout.title.text  # each once


def test_latency_against_a_numeric_setting_colours_each_point_by_its_setting() -> None:
    table = _sweep_table()
    table["chunk"] = [64, 256, 64, 256]
    table["prefill"] = ["chunk=64", "chunk=256", "chunk=64", "chunk=256"]
    table = table.drop(columns="batching")
    figs = sweep_figures(table, ["prefill", "rate"], "rate", ["chunk"])
    colours = setting_colours(table["prefill"])
    against = figs[-1]
    assert "Latency against chunk" in against.layout.title.text
    for trace in against.data:
        if trace.text is not None and trace.marker.color is not None:
            assert list(trace.marker.color) == [colours[s] for s in trace.text]
    legend = [t.name for t in against.data if t.showlegend is not False]
    assert {"chunk=64", "chunk=256"} <= set(legend)


def test_sweep_table_is_in_ms_with_means_beside_p50_and_p99(tmp_path: Path) -> None:
    _sweep_table().to_csv(tmp_path / "sweep.csv", index=False)
    (tmp_path / "sweep.json").write_text(json.dumps({"axes": AXES, "repeat": 1}))
    page = sweep_report(tmp_path, embed=False).read_text()
    head = page[: page.index("<script")]
    assert "TTFT (ms)" in head and "E2E latency (ms)" in head
    assert ">mean<" in head and ">p50<" in head and ">p99<" in head
    assert "ttft_s" not in head  # no column in seconds
    assert ">22.0<" in head  # point 0: TTFT mean 22 ms (0.022 s)


def _run_folder(tmp: Path) -> Path:
    recs = []
    for i in range(6):
        send = 0.1 * i
        chunks = [send + 0.02 + 0.01 * k for k in range(4)]
        recs.append(
            RequestRecord(
                index=i,
                request_id=f"r{i}",
                input_len=16,
                output_len=4,
                send_s=send,
                first_chunk_s=chunks[0],
                end_s=chunks[-1],
                chunk_s=chunks,
                chunk_tokens=[1] * 4,
                output_tokens=4,
                status="ok",
            )
        )
    (tmp / "requests.jsonl").write_text("".join(r.to_json() + "\n" for r in recs))
    pd.DataFrame(
        {
            "t_s": [0.0, 0.5, 1.0],
            "server_cpu_percent": [150.0, 180.0, 120.0],
            "server_rss_mb": [3000.0, 3010.0, 3020.0],
            "engine_running": [1.0, 3.0, 2.0],
            "engine_kv_blocks_used": [10.0, 30.0, 20.0],
        }
    ).to_csv(tmp / "timeline.csv", index=False)
    summary: dict[str, Any] = {
        key: _dist(ms) for key, ms in (("ttft_s", 20), ("itl_s", 10), ("tpot_s", 10), ("e2e_s", 50))
    }
    summary |= {"completed": 6, "failed": 0, "duration_s": 0.6, "request_throughput": 10.0}
    summary |= {"output_throughput": 40.0, "goodput": 10.0, "valid": True, "warnings": []}
    summary["config"] = {
        "run": {
            "name": "smoke",
            "model": "tiny-smollm2",
            "arrival": "poisson",
            "rate": 4.0,
            "num_requests": 6,
            "warmup": 2,
            "input_len": "uniform:16:96",
            "output_len": "16",
        },
        "target": {"kind": "bundled", "base_url": "http://127.0.0.1:1/v1"},
        "engine": {
            "model": "tiny-smollm2",
            "dtype": "float32",
            "scheduler": {"batching": "continuous", "max_num_seqs": 8},
        },
    }
    (tmp / "summary.json").write_text(json.dumps(summary))
    return tmp


def test_run_telemetry_has_one_y_axis_per_unit(tmp_path: Path) -> None:
    run = _run_folder(tmp_path)
    records = [
        RequestRecord.from_dict(json.loads(line))
        for line in (run / "requests.jsonl").read_text().splitlines()
    ]
    fig = throughput_figure(records, pd.read_csv(run / "timeline.csv"))
    axis = {t.name: t.yaxis for t in fig.data}
    cpu = next(v for k, v in axis.items() if "CPU" in k)
    rss = next(v for k, v in axis.items() if "RSS" in k)
    running = next(v for k, v in axis.items() if "running" in k)
    kv = next(v for k, v in axis.items() if "KV" in k)
    assert len({cpu, rss, running, kv}) == 4
    titles = [a.title.text for a in fig.select_yaxes()]
    assert "CPU % (100 = one core)" in titles and "memory (MB)" in titles


def test_run_report_says_what_ran_in_words_and_ms(tmp_path: Path) -> None:
    page = run_report(_run_folder(tmp_path), embed=False).read_text()
    head = page[: page.index("<script")]
    intro = re.search(r"<p>(.*?)</p>", head, re.S)
    assert intro is not None
    assert "{" not in intro.group(1) and "poisson 4 req/s" in intro.group(1)
    assert "6 requests" in intro.group(1) and "tiny-smollm2" in intro.group(1)
    assert "mean (ms)" in head and "p50 (ms)" in head and "p99 (ms)" in head
    assert ">22.0<" in head  # TTFT mean 22 ms beside p50 20 and p99 40
    assert "duration_s" not in head


@pytest.mark.parametrize("n", [1, 12])
def test_setting_colours_are_fixed_by_first_appearance(n: int) -> None:
    labels = [f"s{i}" for i in range(n)]
    colours = setting_colours(labels + labels[::-1])
    assert list(colours) == labels and len(set(colours.values())) == n


def test_gpu_signals_get_their_units() -> None:
    assert signal("gpu0_sm_clock_mhz") == Signal("gpu0 SM clock", "MHz", "clock (MHz)")
    assert signal("gpu1_power_w").axis == "power (W)"
    assert signal("gpu0_memory_used_mb").axis == signal("server_rss_mb").axis == "memory (MB)"
    hits, asked = signal("engine_prefix_cache_hits"), signal("engine_prefix_cache_queries")
    assert hits.axis == asked.axis == "prefix cache (tokens so far)" and hits.unit == "tokens"
