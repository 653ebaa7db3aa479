"""`--workers N` with `--concurrency C`: the C slots split over the workers (C // N each, one
more for the first C % N), the server never sees more than C in flight, a closed loop's
--num-requests and --duration hold over the whole run, and the merged records read as one
process's."""

from __future__ import annotations

import io
import json
import urllib.request
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from rich.console import Console

from bench_cli.run.execute import execute
from loadgen.worker_slots import Dispenser, assign, fit_workers, split_slots

LOAD = {
    "model": "mock",
    "tokenizer": "smollm2-135m",
    "rate": None,
    "warmup": 2,
    "input_len": "uniform:8:24",
    "output_len": "uniform:2:6",
    "seed": 11,
    "max_p99_lag_ms": 1000.0,  # a busy CI machine's lag is not what these tests check
}
TIMINGS = {"send_s", "first_chunk_s", "end_s", "chunk_s", "queue_s", "scheduled_s"}


def run(out: Path, **flags: Any) -> tuple[int, str]:
    buf = io.StringIO()
    rc = execute("default", {**LOAD, "out": str(out), **flags}, False, Console(file=buf, width=200))
    return rc, " ".join(buf.getvalue().split())


def measured(out: Path) -> list[dict]:
    recs = [json.loads(x) for x in (out / "requests.jsonl").read_text().splitlines()]
    return sorted((r for r in recs if not r["warmup"]), key=lambda r: r["index"])


def peak_in_flight(url: str) -> int:
    with urllib.request.urlopen(f"{url.removesuffix('/v1')}/health", timeout=5) as r:
        return json.loads(r.read())["running_peak"]


def test_slots_split_as_inference_perf_splits_them() -> None:
    assert split_slots(5, 2) == [3, 2]
    assert split_slots(7, 3) == [3, 2, 2]
    assert split_slots(4, 4) == [1, 1, 1, 1]
    with pytest.raises(ValueError, match="3 workers cannot share 2 slots"):
        split_slots(2, 3)


def test_arrivals_go_to_workers_in_proportion_to_their_slots() -> None:
    assert assign(6, [1, 1, 1]) == [0, 1, 2, 0, 1, 2]  # equal slots: i mod N, as without a cap
    owners = assign(50, [3, 2])
    assert owners.count(0) == 30 and owners.count(1) == 20
    assert max(len(run) for run in "".join(map(str, owners)).split("1")) <= 2  # spread evenly


def test_the_dispenser_hands_out_no_more_than_the_runs_requests() -> None:
    d = Dispenser(iter("abcdefgh"), 5)
    assert d.take(2) == [(0, 0, "a"), (1, 1, "b")] and not d.exhausted
    assert d.take(10) == [(2, 2, "c"), (3, 3, "d"), (4, 4, "e")] and d.exhausted
    assert d.take(1) == []
    endless = Dispenser(iter("ab"), None)  # --duration alone: until the stream ends
    assert [x for _, _, x in endless.take(5)] == ["a", "b"] and endless.exhausted


def test_more_workers_than_slots_become_one_worker_a_slot_and_say_so() -> None:
    cfg = SimpleNamespace(workers=4, concurrency=2, ray_address=None, closed_loop=True)
    assert "2 workers, one slot each" in (fit_workers(cfg) or "")
    assert cfg.workers == 2
    capped = SimpleNamespace(workers=2, concurrency=3, ray_address=None, closed_loop=False)
    assert "split 2+1 over the workers" in (fit_workers(capped) or "")
    one = SimpleNamespace(workers=1, concurrency=3, ray_address=None, closed_loop=True)
    assert fit_workers(one) is None


def test_a_closed_loop_from_two_workers_writes_one_processs_records(
    tmp_path: Path, mock_server: Callable[..., str]
) -> None:
    url = mock_server("--ttft", "0.02", "--itl", "0.005")
    flags = {"base_url": url, "concurrency": 5, "num_requests": 40}
    rc1, printed1 = run(tmp_path / "one", **flags)
    split_url = mock_server("--ttft", "0.02", "--itl", "0.005")  # its own in-flight peak
    rc2, printed2 = run(tmp_path / "two", **flags | {"base_url": split_url, "workers": "2"})
    assert rc1 == 0 and rc2 == 0, printed1 + printed2
    assert 2 <= peak_in_flight(split_url) <= 5
    one, two = measured(tmp_path / "one"), measured(tmp_path / "two")
    assert [r["index"] for r in two] == list(range(40)), "the asked number, each once"
    for a, b in zip(one, two, strict=True):  # request i is the stream's i-th, as one process
        same = {k: v for k, v in a.items() if k not in TIMINGS}
        assert {k: b[k] for k in same} == same
    assert {r["worker"] for r in two} == {0, 1}
    s2 = json.loads((tmp_path / "two" / "summary.json").read_text())
    assert s2["completed"] == 40 and s2["worker_slots"] == [3, 2] and s2["valid"]
    assert sum(w["requests"] for w in s2["workers"]) == 40
    assert all("scheduled_rate" not in w for w in s2["workers"]), "a closed loop: no schedule"
    assert s2["config"]["run"]["workers"] == 2 and s2["config"]["run"]["concurrency"] == 5


def test_a_closed_loops_duration_holds_over_the_whole_run(
    tmp_path: Path, mock_server: Callable[..., str]
) -> None:
    url = mock_server("--ttft", "0.01", "--itl", "0.005")
    flags = {"base_url": url, "concurrency": 3, "duration": 1.0, "workers": "2"}
    rc, printed = run(tmp_path / "run", **flags)
    assert rc == 0, printed
    recs = measured(tmp_path / "run")
    assert len(recs) >= 10 and len({r["index"] for r in recs}) == len(recs)
    assert {r["worker"] for r in recs} == {0, 1}
    assert max(r["scheduled_s"] for r in recs) < 1.05, "no worker sends past the run's end"
    assert peak_in_flight(url) <= 3
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["completed"] == len(recs) and summary["worker_slots"] == [2, 1]
    assert summary["duration_s"] < 3.0


def test_a_cap_on_an_open_loop_is_split_and_never_exceeded(
    tmp_path: Path, mock_server: Callable[..., str]
) -> None:
    url = mock_server("--ttft", "0.05", "--itl", "0.01")  # ~0.08 s a request: ~8 wanted at once
    flags = {"base_url": url, "rate": 100.0, "concurrency": 3, "num_requests": 30}
    rc, printed = run(tmp_path / "run", **flags | {"workers": "2", "output_len": "4"})
    assert rc == 0, printed
    assert "split 2+1 over the workers" in printed
    assert peak_in_flight(url) <= 3
    recs = measured(tmp_path / "run")
    assert [r["index"] for r in recs] == list(range(30))
    assert any(r["queue_s"] > 0 for r in recs), "arrivals waited for a slot"
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert [w["requests"] for w in summary["workers"]] == [20, 10]  # in proportion to 2+1
    assert "split 2+1" in summary["config"]["workers_split"]


def test_more_workers_than_a_closed_loops_slots_run_one_a_slot(
    tmp_path: Path, mock_server: Callable[..., str]
) -> None:
    url = mock_server("--ttft", "0.01", "--itl", "0.002")
    rc, printed = run(
        tmp_path / "run", base_url=url, concurrency=2, num_requests=12, workers="3", warmup=0
    )
    assert rc == 0 and "--workers 3 with --concurrency 2: 2 workers" in printed, printed
    assert peak_in_flight(url) <= 2
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["config"]["run"]["workers"] == 2 and summary["completed"] == 12
