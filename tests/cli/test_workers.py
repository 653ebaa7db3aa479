"""`bench run --workers N`: one seeded schedule sent from N worker processes writes what one
process writes; a signal stops every worker and keeps their records; a dead worker fails the
run; a late worker makes it INVALID; what cannot be split is refused."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest
from rich.console import Console

from bench_cli.outcome import notices
from bench_cli.run.execute import execute
from loadgen.metrics import summarize
from loadgen.per_worker import judge_workers
from loadgen.records import RequestRecord

TIMINGS = {"send_s", "first_chunk_s", "end_s", "chunk_s", "queue_s"}
LOAD = {
    "model": "mock",
    "tokenizer": "smollm2-135m",
    "rate": 30.0,
    "num_requests": 30,
    "warmup": 3,
    "input_len": "uniform:8:24",
    "output_len": "uniform:2:6",
    "seed": 7,
    "max_p99_lag_ms": 1000.0,  # a busy CI machine's lag is not what these tests check
}


def run(out: Path, dashboard: bool = False, **flags: Any) -> tuple[int, str]:
    buf = io.StringIO()
    console = Console(file=buf, width=120, force_terminal=dashboard)
    rc = execute("default", {**LOAD, "out": str(out), **flags}, dashboard, console)
    return rc, buf.getvalue()


def records(out: Path) -> list[dict]:
    lines = (out / "requests.jsonl").read_text().splitlines()
    return sorted((json.loads(x) for x in lines), key=lambda r: (r["warmup"], r["index"]))


def test_two_workers_write_the_records_one_process_writes(
    tmp_path: Path, mock_server: Callable[..., str]
) -> None:
    url = mock_server("--ttft", "0.02", "--itl", "0.005")
    rc1, printed1 = run(tmp_path / "one", base_url=url)
    rc2, printed2 = run(tmp_path / "two", base_url=url, workers="2", dashboard=True)
    assert rc1 == 0 and rc2 == 0, printed1 + printed2
    one, two = records(tmp_path / "one"), records(tmp_path / "two")
    assert len(one) == len(two) == 33
    for a, b in zip(one, two, strict=True):
        assert "worker" not in a  # one process: its lines as they always were
        if b["warmup"]:  # a warm-up's scheduled_s is when it went: a timing
            a, b = {**a, "scheduled_s": 0}, {**b, "scheduled_s": 0}
        same = {k: v for k, v in a.items() if k not in TIMINGS}
        assert {k: b[k] for k in same} == same
    assert {r["worker"] for r in two if not r["warmup"]} == {0, 1}
    assert [r["worker"] for r in two if not r["warmup"]] == [i % 2 for i in range(30)]
    s1, s2 = (json.loads((tmp_path / d / "summary.json").read_text()) for d in ("one", "two"))
    for key in ("completed", "failed", "cancelled", "total_input_tokens", "total_output_tokens"):
        assert s1[key] == s2[key], key
    assert s2["completed"] == 30 and s2["warmup_requests"] == 3
    assert s2["test_request"]["request_id"] == s1["test_request"]["request_id"]
    assert s2["arrival_check"]["n"] == 30 and s2["config"]["run"]["workers"] == 2
    assert [w["requests"] for w in s2["workers"]] == [15, 15]
    assert all(w["valid"] and w["schedule_lag_s"]["count"] == 15 for w in s2["workers"])
    assert "workers" not in s1 and s1["config"]["run"]["workers"] == 1
    # the live view in the driver counted both workers' requests
    assert "sent 30/30" in printed2 and "ok 30" in printed2, printed2


def _requests_seen(url: str) -> int:
    with urllib.request.urlopen(f"{url.removesuffix('/v1')}/health", timeout=5) as r:
        return json.loads(r.read())["requests"]


def _bench(url: str, out: Path, requests: int, output_len: int) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "bench_cli", "run", "--base-url", url, "--model", "mock"]
    cmd += ["--tokenizer", "smollm2-135m", "--rate", "40", "--num-requests", str(requests)]
    cmd += ["--input-len", "16", "--output-len", str(output_len), "--warmup", "0"]
    cmd += ["--workers", "2", "--no-dashboard", "--out", str(out), "--max-p99-lag-ms", "1000"]
    # a session of its own: a signal to its group reaches every worker, as Ctrl-C does
    return subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )


def _workers_of(proc: subprocess.Popen) -> list[psutil.Process]:
    children = psutil.Process(proc.pid).children()
    return [c for c in children if "spawn_main" in " ".join(c.cmdline())]


def test_ctrl_c_stops_every_worker_and_keeps_their_records(
    tmp_path: Path, mock_server: Callable[..., str]
) -> None:
    url = mock_server("--ttft", "0.05", "--itl", "0.1")  # each stream lasts 40 s
    out = tmp_path / "run"
    proc = _bench(url, out, 40, 400)
    try:
        deadline = time.monotonic() + 90
        while _requests_seen(url) < 8 and time.monotonic() < deadline:
            time.sleep(0.05)
        workers = _workers_of(proc)
        assert len(workers) == 2
        os.killpg(proc.pid, signal.SIGINT)  # the terminal's Ctrl-C: the whole group
        printed, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, printed
    assert all(not w.is_running() or w.status() == psutil.STATUS_ZOMBIE for w in workers)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["interrupted"] and summary["stopped_in"] == "load"
    assert summary["worker_failure"] is None
    recs = records(out)
    assert {r["worker"] for r in recs} == {0, 1}, "records of both workers kept"
    assert {r["status"] for r in recs} == {"cancelled"} and len(recs) >= 6
    assert (out / "report.html").is_file()
    assert "during the load" in " ".join(printed.split())


def test_a_killed_worker_fails_the_run_with_its_reason(
    tmp_path: Path, mock_server: Callable[..., str]
) -> None:
    url = mock_server("--ttft", "0.02", "--itl", "0.005")  # each stream 0.1 s; the load 5 s
    out = tmp_path / "run"
    proc = _bench(url, out, 200, 20)
    try:
        deadline = time.monotonic() + 90
        while _requests_seen(url) < 60 and time.monotonic() < deadline:
            time.sleep(0.05)
        workers = _workers_of(proc)
        assert len(workers) == 2
        workers[0].kill()
        printed, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    text = " ".join(printed.split())
    assert proc.returncode == 1, printed
    assert "WORKER FAILED" in text and "killed by SIGKILL" in text, printed
    summary = json.loads((out / "summary.json").read_text())
    assert "died: killed by SIGKILL" in summary["worker_failure"]
    assert not summary["interrupted"]
    kept = records(out)
    assert len({r["worker"] for r in kept}) == 2, "the records sent before are kept"
    assert len(kept) < 200 and summary["completed"] == sum(r["status"] == "ok" for r in kept)


def _rec(i: int, worker: int, lag_s: float) -> RequestRecord:
    rec = RequestRecord(i, f"r-{i}", 8, 4, scheduled_s=i * 0.01, status="ok", worker=worker)
    rec.send_s = rec.scheduled_s + lag_s
    rec.first_chunk_s, rec.end_s, rec.output_tokens = rec.send_s + 0.01, rec.send_s + 0.02, 4
    return rec


def test_one_late_worker_makes_the_run_invalid_though_the_merged_p99_is_kept() -> None:
    recs = [_rec(i, 0, 0.0) for i in range(200)] + [_rec(200 + i, 1, 0.05) for i in range(2)]
    summary = summarize(recs, 3.0, max_p99_lag_s=0.01)
    assert summary["valid"], "the merged p99 alone is within the limit"
    judge_workers(summary, recs)
    assert not summary["valid"]
    assert [w["valid"] for w in summary["workers"]] == [True, False]
    assert any("worker 1 fell behind" in w for w in summary["warnings"])
    invalid = [n for n in notices(summary) if n.label == "INVALID RUN"]
    assert invalid and "p99 schedule lag over 10 ms: worker 1's 50.0 ms" in invalid[0].text


def test_the_late_worker_is_named_in_the_printed_table_and_the_report(tmp_path: Path) -> None:
    from bench_cli.report.run import run_report
    from bench_cli.tables import print_result

    recs = [_rec(i, 0, 0.0) for i in range(200)] + [_rec(200 + i, 1, 0.05) for i in range(4)]
    recs += [_rec(300, 2, 0.05)]
    summary = summarize(recs, 3.0, max_p99_lag_s=0.01)
    judge_workers(summary, recs)
    buf = io.StringIO()
    print_result(Console(file=buf, width=160), summary, "run")
    lines = buf.getvalue().splitlines()
    assert any(line.startswith("Per worker (3 processes)") for line in lines)
    row = {line.split("│")[1].strip(): line for line in lines if line.count("│") == 10}
    assert set(row) == {"0", "1", "2"}
    assert "NO: LATE" in row["1"] and "NO: LATE" in row["2"] and "yes" in row["0"]
    cells = [c.strip() for c in row["1"].split("│")[1:-1]]
    assert cells[:3] == ["1", "4", "4"] and cells[4] == "50.00"  # sent, ok, lag p99 (ms)
    text = " ".join(buf.getvalue().split())
    assert "INVALID RUN" in text and "worker 1's 50.0 ms, worker 2's 50.0 ms" in text
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    (tmp_path / "requests.jsonl").write_text("".join(r.to_json() + "\n" for r in recs))
    page = run_report(tmp_path, embed=False).read_text()
    assert "Per worker (3 processes)" in page and page.count("NO: LATE") == 2
    assert "worker 1&#x27;s 50.0 ms" in page


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        ({"workers": "auto", "rate": None, "concurrency": 4}, "auto sizes the workers"),
        ({"workers": "0"}, "expected a whole number >= 1"),
        ({"workers": "2", "in_process": True}, "cannot be split across processes"),
        ({"workers": "2", "engine_kind": "sim"}, "cannot be split across processes"),
    ],
)
def test_what_cannot_be_split_is_refused(tmp_path: Path, flags: dict, said: str) -> None:
    rc, printed = run(tmp_path / "run", **{"model": "tiny-smollm2", "tokenizer": None, **flags})
    assert rc == 2 and said in " ".join(printed.split()), printed


def test_a_failed_test_request_stops_every_worker_at_once(tmp_path: Path) -> None:
    """Worker 0 sends the test request alone; the others wait for it and stop with it."""
    from bench_cli.local_server import free_port

    t = time.monotonic()
    rc, printed = run(tmp_path / "run", base_url=f"http://127.0.0.1:{free_port()}/v1", workers="3")
    text = " ".join(printed.split())
    assert rc == 1 and "the test request to" in text and "WORKER FAILED" not in text, printed
    assert time.monotonic() - t < 30  # not a worker's STOP_WAIT_S, nor a timeout
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["test_request"]["status"] == "error" and summary["worker_failure"] is None
    assert (tmp_path / "run" / "requests.jsonl").read_text() == ""


def test_ray_workers_on_other_hosts_cannot_reach_a_loopback_server() -> None:
    """Placed on another node, a worker would fail every request to 127.0.0.1: the run says
    so before the load starts (no Ray needed to check the rule)."""
    import socket
    from types import SimpleNamespace

    from loadgen.ray_runner import ClockOffset, RaySplitRunner

    runner = object.__new__(RaySplitRunner)
    here = socket.gethostname()
    runner.clock_offsets = [ClockOffset(0, here, 1, 0.0, 1e-4)]
    runner.backend = SimpleNamespace(url="http://127.0.0.1:8000/v1/completions")
    runner._check_reachable()  # every worker on this machine: fine
    runner.clock_offsets.append(ClockOffset(1, "node-b", 2, 0.0, 1e-4))
    with pytest.raises(RuntimeError, match="placed workers on node-b"):
        runner._check_reachable()
    runner.backend = SimpleNamespace(url="http://10.0.0.5:8000/v1/completions")
    runner._check_reachable()  # an address the cluster can reach
