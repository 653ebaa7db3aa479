"""The live dashboard the way a person sees it: `bench run` in a tmux pane, read back with
capture-pane; and the plain progress lines a log gets instead."""

from __future__ import annotations

import io
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import pytest
from rich.console import Console

from bench_cli.dashboard import Dashboard, sparkline
from loadgen.runner import Progress

needs_tmux = pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux")


def test_sparkline() -> None:
    assert sparkline([0, 1, 2, 3, 4, 5, 6, 7]) == "▁▂▃▄▅▆▇█"
    assert sparkline([5, 5, 5]) == "▁▁▁" and sparkline([]) == ""


def _screen(progress: Progress, elapsed_s: float, duration_s: float | None = None) -> str:
    """The live panel rendered as text, for a runner `elapsed_s` into its load."""
    runner = SimpleNamespace(
        progress=progress,
        t0=time.perf_counter() - elapsed_s,
        records=[],
        plan=SimpleNamespace(duration_s=duration_s, offsets=None),
        next_send=None,
    )
    rows = [
        {"t": 0.1 * i, "server_cpu_percent": 150.0, "server_rss_mb": 3000.0, "engine_running": 3}
        for i in range(20)
    ]
    buf = io.StringIO()
    console = Console(file=buf, width=100, force_terminal=False)
    view = Dashboard(runner, SimpleNamespace(rows=rows), "t", 4.0, console)
    console.print(view.render())
    return buf.getvalue()


def test_the_live_view_shows_progress_with_an_eta_from_requests_done() -> None:
    screen = _screen(Progress(total=100, sent=60, completed=40, failed=10), elapsed_s=10.0)
    assert "50/100 requests" in screen and "ETA 10 s" in screen, screen  # half done in 10 s


def test_a_duration_run_shows_its_eta_from_the_clock() -> None:
    screen = _screen(Progress(sent=5, completed=5), elapsed_s=15.0, duration_s=60.0)
    assert "15/60 s" in screen and "ETA 45 s" in screen, screen


def test_sparklines_say_their_units() -> None:
    screen = _screen(Progress(total=10), elapsed_s=1.0)
    assert "% (100 = one core)" in screen and "MB" in screen, screen
    assert "requests" in screen and "tok/s" in screen, screen


def pane(session: str, history: bool = False) -> str:
    """What the pane shows; with `history`, what scrolled off it too (as a person scrolls)."""
    cmd = ["tmux", "capture-pane", "-p", "-t", session, *(["-S", "-"] if history else [])]
    return subprocess.run(cmd, capture_output=True, text=True, check=True).stdout


@needs_tmux
def test_dashboard_in_a_terminal(tmp_path: Path, mock_server: Callable[..., str]) -> None:
    url = mock_server("--ttft", "0.05", "--itl", "0.02")
    out = tmp_path / "run"
    session = f"sb{int(time.time() * 1000) % 10**8}"
    cmd = (
        f"{sys.executable} -m bench_cli run --base-url {url} --rate 10 --num-requests 100 "
        f"--output-len 16 --input-len 32 --out {out}; sleep 60"
    )
    subprocess.run(
        ["tmux", "new-session", "-d", "-s", session, "-x", "120", "-y", "50", cmd], check=True
    )
    try:
        screen = ""
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # mid-run: the live panel
            screen = pane(session)
            if "sent" in screen and "ok " in screen and "TTFT" in screen and " s " in screen:
                break
            time.sleep(0.5)
        assert "servebench" in screen and "in flight" in screen, screen
        assert "rate" in screen and "of 10 req/s" in screen and "p50 / p99 ms" in screen, screen
        while time.monotonic() < deadline and "results:" not in screen:  # the end: tables
            time.sleep(0.5)
            screen = pane(session)
        # the tables, and above them what a busy machine adds (lag, steal): scrolled up to
        screen = pane(session, history=True)
        assert "Successful requests" in screen and "sent 100/100" in screen, screen
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], check=False)


def test_without_a_terminal_a_log_gets_progress_lines(
    tmp_path: Path, mock_server: Callable[..., str]
) -> None:
    url = mock_server("--ttft", "0.05", "--itl", "0.02")
    cmd = [sys.executable, "-m", "bench_cli", "run", "--base-url", url, "--rate", "10"]
    cmd += ["--num-requests", "70", "--output-len", "8", "--input-len", "16"]
    cmd += ["--out", str(tmp_path / "run"), "--max-p99-lag-ms", "1000"]  # lag: not checked
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = [
        line for line in done.stdout.splitlines() if line.startswith("default: ") and " s, " in line
    ]
    assert lines and "sent" in lines[0] and "TTFT" in lines[0]  # one every 5 s
    assert "/70 requests · ETA" in lines[0], lines[0]
    assert "╭" not in done.stdout  # no live panel in a log


def test_live_itl_is_each_requests_own_gaps() -> None:
    """Two requests one after the other: the 0.3 s between the first's end and the second's
    start is no inter-token latency (the live view once showed it as ITL p99)."""
    from loadgen.records import RequestRecord

    recs = []
    for i, start in enumerate((0.0, 0.5)):
        r = RequestRecord(i, f"r{i}", 4, 4, status="ok", output_tokens=4)
        r.send_s, r.chunk_s = start, [start + 0.1, start + 0.12, start + 0.14, start + 0.16]
        r.first_chunk_s, r.end_s = r.chunk_s[0], r.chunk_s[-1]
        recs.append(r)
    runner = SimpleNamespace(progress=Progress(), t0=time.perf_counter(), records=recs)
    view = Dashboard(runner, None, "t", None, Console(file=io.StringIO()))
    _, itl, _, _ = view._latencies()
    assert itl == "20 / 20", itl
