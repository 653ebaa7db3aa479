"""--workers auto: N from the schedule's busiest second and the measured per-worker
capacity, capped by the cores less a bundled server's (the measurement is injected)."""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from pathlib import Path

import pytest
from rich.console import Console

from bench_cli.run.execute import execute
from loadgen import worker_count
from loadgen.worker_count import busiest_second, choose_workers, measure_cpu_per_request


def test_the_busiest_second_not_the_mean_sets_the_rate() -> None:
    # 10 req/s for 9 s, then 100 sends in the last second: a ramp's end, a trace's burst
    offsets = [i * 0.1 for i in range(90)] + [9 + i * 0.01 for i in range(100)]
    assert busiest_second(offsets) == 100
    assert busiest_second([0.0, 0.1, 0.2]) == pytest.approx(10.0)  # under a second long


def test_workers_are_what_the_rate_needs_capped_by_the_cores() -> None:
    offsets = [i / 2900 for i in range(5800)]  # 2,900 req/s
    # 500 us of client CPU a request: 2,000 req/s busy, 1,000 planned a worker
    assert choose_workers(offsets, 500e-6, cores=16).workers == 3
    capped = choose_workers(offsets, 500e-6, cores=2)
    assert capped.workers == 2 and capped.needed == 3
    assert "needs 3: too few cores" in capped.reason()
    # a bundled server on 12 of 16 cores leaves the workers 4
    shared = choose_workers([i / 8900 for i in range(8900)], 500e-6, cores=16, server_cores=12)
    assert shared.workers == 4 and "12 left to the bundled server" in shared.reason()
    assert choose_workers(offsets, 500e-6, cores=4, server_cores=4).workers == 1


def test_the_measurement_sends_real_streams_through_the_client() -> None:
    cpu = measure_cpu_per_request(0.2)
    assert 1e-6 < cpu < 0.1  # a real cost, not a constant: some microseconds a request


def test_auto_picks_n_at_start_and_says_why(
    tmp_path: Path, mock_server: Callable[..., str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(worker_count, "measure_cpu_per_request", lambda: 0.5 / 12)  # 12 req/s
    monkeypatch.setattr(worker_count, "usable_cores", lambda: 8)
    url = mock_server("--ttft", "0.01", "--itl", "0.002")
    buf = io.StringIO()
    flags = {"model": "mock", "tokenizer": "smollm2-135m", "rate": 30.0, "num_requests": 40}
    flags |= {"input_len": "8", "output_len": "2", "seed": 3, "max_p99_lag_ms": 1000.0}
    flags |= {"base_url": url, "workers": "auto", "out": str(tmp_path / "run")}
    rc = execute("default", flags, False, Console(file=buf, width=200))
    printed = buf.getvalue()
    assert rc == 0, printed
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    choice = summary["config"]["workers_auto"]
    expected = -(-int(choice["busiest_rate"]) // 12)  # ceil: 12 req/s a worker
    assert choice["workers"] == expected >= 3 and choice["server_cores"] == 0
    assert summary["config"]["run"]["workers"] == expected
    assert len(summary["workers"]) == expected
    assert f"--workers auto: {expected} worker processes for a busiest second of" in printed
