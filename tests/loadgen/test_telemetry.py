"""Telemetry: NVML through a fake `pynvml` (no GPU here), the CPU/RSS fallback for real, and
the engine gauges scraped from Prometheus text (ours and vLLM's names)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import types
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pytest

from loadgen.telemetry import Telemetry, parse_gauges


def test_engine_gauges_ours_and_vllms() -> None:
    ours = "# HELP x\nservebench:num_requests_running 3\nservebench:kv_blocks_used 41\n"
    vllm = (
        'vllm:num_requests_running{model_name="a"} 2.0\n'
        'vllm:num_requests_running{model_name="b"} 1.0\n'
        'vllm:gpu_cache_usage_perc{model_name="a"} 0.25\nvllm:other 9\n'
    )
    assert parse_gauges(ours) == {"running": 3.0, "kv_blocks_used": 41.0}
    assert parse_gauges(vllm) == {"running": 3.0, "kv_usage": 0.25}  # summed over models


@pytest.fixture
def fake_nvml(monkeypatch: pytest.MonkeyPatch) -> Iterator[types.ModuleType]:
    nv = types.ModuleType("pynvml")

    def util(h: int) -> types.SimpleNamespace:
        return types.SimpleNamespace(gpu=50 + 10 * h)

    nv.NVML_CLOCK_SM = 1  # type: ignore[attr-defined]
    nv.nvmlInit = lambda: None  # type: ignore[attr-defined]
    nv.nvmlShutdown = lambda: None  # type: ignore[attr-defined]
    nv.nvmlDeviceGetCount = lambda: 2  # type: ignore[attr-defined]
    nv.nvmlDeviceGetHandleByIndex = lambda i: i  # type: ignore[attr-defined]
    nv.nvmlDeviceGetUtilizationRates = util  # type: ignore[attr-defined]
    nv.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(  # type: ignore[attr-defined]
        used=(1 + h) * 2**30, total=80 * 2**30
    )
    nv.nvmlDeviceGetPowerUsage = lambda h: 300_000  # type: ignore[attr-defined]
    nv.nvmlDeviceGetClockInfo = lambda h, kind: 1980  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "pynvml", nv)
    yield nv


def test_gpus_through_nvml(fake_nvml: types.ModuleType, tmp_path: Path) -> None:
    tel = Telemetry(pid=None, interval_s=0.01)
    tel.start()
    time.sleep(0.2)
    tel.stop()
    s = tel.summary()
    assert s["samples"] >= 5 and s["notes"] == []
    assert s["peak_gpu1_memory_used_mb"] == pytest.approx(2048)
    assert s["mean_gpu0_util_percent"] == 50 and s["peak_gpu1_util_percent"] == 60
    assert s["mean_gpu0_power_w"] == pytest.approx(300) and s["peak_gpu0_sm_clock_mhz"] == 1980
    tel.write_csv(tmp_path / "timeline.csv", t0=tel.rows[0]["t"])
    frame = pd.read_csv(tmp_path / "timeline.csv")
    assert frame["t_s"].iloc[0] == 0 and frame["t_s"].is_monotonic_increasing
    assert "gpu1_memory_total_mb" in frame.columns


def test_without_a_gpu_the_server_process_is_sampled() -> None:
    """The real pynvml here finds no driver: say so once, then CPU% and RSS of the server."""
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        tel = Telemetry(pid=busy.pid, interval_s=0.05)
        tel.start()
        time.sleep(0.6)
        tel.stop()
    finally:
        busy.kill()
        busy.wait()
    s = tel.summary()
    assert any("no GPU telemetry" in n for n in s["notes"])
    assert s["mean_server_cpu_percent"] > 20 and s["peak_server_rss_mb"] > 1
    assert not any(k.startswith(("peak_gpu", "mean_gpu")) for k in s)


def test_a_vanished_process_and_a_dead_metrics_url_do_not_crash() -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    tel = Telemetry(pid=gone.pid, metrics_url="http://127.0.0.1:9/metrics", interval_s=0.01)
    tel.start()
    time.sleep(0.05)
    tel.stop()
    assert tel.summary()["samples"] >= 1


def test_a_remote_servers_rss_comes_from_its_metrics(monkeypatch: pytest.MonkeyPatch) -> None:
    """--base-url runs have no process to sample: the server's process_resident_memory_bytes
    (exported by Prometheus clients, ours and vLLM's) fills the same column."""
    import io
    import urllib.request

    page = b"servebench:num_requests_running 2\nprocess_resident_memory_bytes 3221225472.0\n"
    monkeypatch.setattr(urllib.request, "urlopen", lambda *a, **k: io.BytesIO(page))
    tel = Telemetry(pid=None, metrics_url="http://127.0.0.1:1/metrics", interval_s=0.01)
    row: dict[str, float] = {}
    tel._scrape(row)
    assert row == {"server_rss_mb": 3072.0, "engine_running": 2.0}


def test_a_base_url_run_does_not_claim_cpu_telemetry_it_did_not_take() -> None:
    """Before, summary.json said "CPU and memory instead" for --base-url runs while
    timeline.csv had no CPU column; now the notes and `columns` say what was sampled."""
    tel = Telemetry(pid=None, metrics_url="http://127.0.0.1:9/metrics", interval_s=0.01)
    tel.start()
    time.sleep(0.05)
    tel.stop()
    s = tel.summary()
    assert not any(c.startswith("server_") for c in s["columns"])
    assert not any("CPU and memory" in n for n in s["notes"])
    assert any(n.startswith("no CPU telemetry") for n in s["notes"])
    assert any(
        n.startswith("no engine gauges: nothing read from http://127.0.0.1:9/metrics")
        for n in s["notes"]
    )


def test_the_summary_lists_the_sampled_columns() -> None:
    tel = Telemetry(pid=os.getpid(), interval_s=0.01)
    tel.start()
    time.sleep(0.05)
    tel.stop()
    s = tel.summary()
    assert {"server_cpu_percent", "server_rss_mb"} <= set(s["columns"])
    assert not any(n.startswith("no CPU telemetry") for n in s["notes"])


def test_the_prefix_cache_hit_rate_is_taken_over_the_run() -> None:
    """The counters are the server's lifetime's: the run's hit rate is their growth's ratio."""
    tel = Telemetry(pid=None, metrics_url=None)
    tel.rows = [
        {"t": 0.0, "engine_prefix_cache_queries": 1000.0, "engine_prefix_cache_hits": 900.0},
        {"t": 1.0, "engine_prefix_cache_queries": 1400.0, "engine_prefix_cache_hits": 1000.0},
    ]
    assert tel.summary()["prefix_cache_hit_rate"] == 0.25
    page = "vllm:prefix_cache_queries_total 5\nservebench:prefix_cache_hits_total 3\n"
    assert parse_gauges(page) == {"prefix_cache_queries": 5.0, "prefix_cache_hits": 3.0}


def test_speculation_by_draft_position_from_vllms_counters_over_the_run() -> None:
    """vLLM labels accepted tokens by position: each is its own column, taken over the run."""
    page = "\n".join(
        [
            'vllm:spec_decode_num_drafts_total{model_name="m"} 10',
            'vllm:spec_decode_num_draft_tokens_total{model_name="m"} 30',
            'vllm:spec_decode_num_accepted_tokens_total{model_name="m"} 14',
            'vllm:spec_decode_num_accepted_tokens_per_pos_total{model_name="m",position="0"} 8',
            'vllm:spec_decode_num_accepted_tokens_per_pos_total{model_name="m",position="1"} 4',
            'vllm:spec_decode_num_accepted_tokens_per_pos_total{model_name="m",position="2"} 2',
        ]
    )
    start = {f"engine_{k}": v for k, v in parse_gauges(page).items()}
    assert start["engine_spec_accepted_pos1"] == 4.0
    later = {k: 2 * v for k, v in start.items()}  # the run doubled every counter
    tel = Telemetry(pid=None, metrics_url=None)
    tel.rows = [{"t": 0.0, **start}, {"t": 1.0, **later}]
    s = tel.summary()
    assert s["spec_drafts"] == 10 and s["spec_acceptance_rate"] == 14 / 30
    assert s["spec_acceptance_per_pos"] == [0.8, 0.4, 0.2]
    assert "spec_draft_share" not in s  # vLLM does not count lookups
