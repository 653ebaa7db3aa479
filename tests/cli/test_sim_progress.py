"""A simulated run's progress line: drawn by a thread on wall time (its event loop runs on
virtual time), gone when cancelled, and no change to what the simulation computes."""

from __future__ import annotations

import asyncio
import io
import time
from pathlib import Path
from types import SimpleNamespace

from rich.console import Console

from bench_cli.run.execute import execute
from bench_cli.run.sim_progress import SimProgress
from loadgen.runner import Progress
from tests.engine.sim.test_sim import SIM


def _runner(
    now: float, total: int | None = None, duration: float | None = 600.0
) -> SimpleNamespace:
    progress = Progress(total=total, sent=2500, completed=2400, failed=3, in_flight=97)
    plan = SimpleNamespace(duration_s=duration)
    return SimpleNamespace(progress=progress, plan=plan, t0=10.0, clock=lambda: 10.0 + now)


def test_the_line_says_simulated_time_the_share_done_and_the_counts() -> None:
    view = SimProgress(_runner(300.0), "default", Console(file=io.StringIO()))
    view.started -= 6.0  # six wall seconds in: halfway, so six more
    text = view.text()
    assert text.startswith("SIMULATING default: 300 simulated s (50%, ETA 6 s) · 50x real time")
    assert text.endswith("sent 2,500 · in flight 97 · ok 2,400 · failed 3")
    by_count = SimProgress(_runner(30.0, total=4806, duration=None), "d", Console()).text()
    assert "30 simulated s (50%, ETA" in by_count  # 2,403 of 4,806 requests ended


def test_without_a_terminal_it_prints_lines_until_cancelled() -> None:
    buf = io.StringIO()
    view = SimProgress(_runner(120.0), "default", Console(file=buf, width=200), 0.02)

    async def main() -> None:
        task = asyncio.create_task(view.run())
        await asyncio.sleep(0.2)
        task.cancel()

    asyncio.run(main())
    lines = buf.getvalue().splitlines()
    assert len(lines) >= 2 and all(x.startswith("SIMULATING default: 120") for x in lines)
    time.sleep(0.1)
    assert buf.getvalue().splitlines() == lines  # the thread stopped with the run


def test_the_simulation_is_the_same_with_the_line_and_without(tmp_path: Path) -> None:
    """The line waits on no timer of the virtual loop (a redraw timer there would fire tens of
    times a simulated second): every record and step comes out byte for byte the same."""
    outs = []
    for dashboard in (True, False):
        out = tmp_path / f"dashboard-{dashboard}"
        flags = {**SIM, "out": str(out), "rate": 40.0, "num_requests": 200}
        assert execute("default", flags, dashboard, Console(file=io.StringIO())) == 0
        outs.append(out)
    for name in ("requests.jsonl", "steps.jsonl"):
        assert (outs[0] / name).read_bytes() == (outs[1] / name).read_bytes(), name
