"""`bench run --ray-address`: the workers as Ray actors on a local Ray instance. Skipped,
saying so, where ray is not installed (it is the optional extra servebench[ray])."""

from __future__ import annotations

import io
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from rich.console import Console

from bench_cli.run.execute import execute


def test_without_ray_the_run_says_how_to_get_it(monkeypatch: pytest.MonkeyPatch) -> None:
    from loadgen.ray_runner import import_ray

    monkeypatch.setitem(sys.modules, "ray", None)  # import ray raises ImportError
    with pytest.raises(ValueError, match=r"pip install 'servebench\[ray\]'"):
        import_ray()


def test_ray_workers_write_the_merged_records_with_their_clock_offsets(
    local_ray: None, tmp_path: Path, mock_server: Callable[..., str]
) -> None:
    url = mock_server("--ttft", "0.01", "--itl", "0.002")
    buf = io.StringIO()
    flags = {"model": "mock", "tokenizer": "smollm2-135m", "rate": 30.0, "num_requests": 30}
    flags |= {"warmup": 2, "input_len": "8", "output_len": "4", "seed": 5}
    flags |= {"max_p99_lag_ms": 1000.0, "base_url": url, "out": str(tmp_path / "run")}
    flags |= {"workers": "2", "ray_address": "local"}
    rc = execute("default", flags, False, Console(file=buf, width=200))
    assert rc == 0, buf.getvalue()
    lines = (tmp_path / "run" / "requests.jsonl").read_text().splitlines()
    recs = [json.loads(x) for x in lines]
    measured = sorted((r for r in recs if not r["warmup"]), key=lambda r: r["index"])
    assert [r["index"] for r in measured] == list(range(30))
    assert [r["worker"] for r in measured] == [i % 2 for i in range(30)]
    assert all(r["status"] == "ok" for r in recs) and len(recs) == 32
    # each record's schedule on the driver's zero: lags small though each worker has its clock
    assert max(r["send_s"] - r["scheduled_s"] for r in measured) < 1.0
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["completed"] == 30 and [w["requests"] for w in summary["workers"]] == [15, 15]
    offsets = summary["clock_offsets"]
    assert [c["worker"] for c in offsets] == [0, 1]
    assert len({c["pid"] for c in offsets} | {os.getpid()}) == 3  # two actor processes
    for c in offsets:  # one machine, one CLOCK_MONOTONIC: the true offset is 0
        assert 0 < c["uncertainty_s"] < 0.5
        assert abs(c["offset_s"]) <= c["uncertainty_s"] + 1e-9
    assert summary["ray_address"] == "local"
    printed = " ".join(buf.getvalue().split())
    assert "Per worker (2 processes) on Ray" in printed
    assert "worker 1 on " in printed and " ms +- " in printed  # the offset's uncertainty
    page = (tmp_path / "run" / "report.html").read_text()
    assert "worker 1 on " in page and " ms +- " in page


def test_ray_workers_share_a_closed_loops_slots_and_requests(
    local_ray: None, tmp_path: Path, mock_server: Callable[..., str]
) -> None:
    """The driver hands a closed loop's requests to the actors as they ask (over Ray)."""
    import urllib.request

    url = mock_server("--ttft", "0.01", "--itl", "0.002")
    buf = io.StringIO()
    flags = {"model": "mock", "tokenizer": "smollm2-135m", "concurrency": 3, "num_requests": 24}
    flags |= {"warmup": 0, "input_len": "8", "output_len": "4", "seed": 5, "rate": None}
    flags |= {"max_p99_lag_ms": 1000.0, "base_url": url, "out": str(tmp_path / "run")}
    flags |= {"workers": "2", "ray_address": "local"}
    rc = execute("default", flags, False, Console(file=buf, width=200))
    assert rc == 0, buf.getvalue()
    lines = (tmp_path / "run" / "requests.jsonl").read_text().splitlines()
    recs = sorted((json.loads(x) for x in lines), key=lambda r: r["index"])
    assert [r["index"] for r in recs] == list(range(24))
    assert {r["worker"] for r in recs} == {0, 1} and all(r["status"] == "ok" for r in recs)
    with urllib.request.urlopen(f"{url.removesuffix('/v1')}/health", timeout=5) as r:
        assert json.loads(r.read())["running_peak"] <= 3
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["worker_slots"] == [2, 1] and summary["completed"] == 24
