"""What a simulated run shows while it runs. Its event loop jumps from timer to timer in
virtual time, so the dashboard's redraw timer would fire tens of times a simulated second
(and cut the simulation's decode stretches short); this line is drawn by a thread on wall
time instead (rich Live's refresh thread on a terminal, a line every few seconds in a log),
from the runner's counters and the virtual clock. An hour of 100 req/s takes ~2 minutes:
without it the terminal stayed blank until the summary."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.text import Text

from bench_cli.dashboard import _duration, progress


class SimProgress:
    def __init__(self, runner: Any, title: str, console: Console, line_every_s: float = 5.0):
        self.runner, self.title, self.console = runner, title, console
        self.line_every_s = line_every_s
        self.started = time.perf_counter()

    def text(self) -> str:
        r, p = self.runner, self.runner.progress
        simulated = r.clock() - r.t0 if r.t0 else 0.0
        wall = time.perf_counter() - self.started
        done = f"{simulated:,.0f} simulated s"
        state = progress(p.completed + p.failed, p.total, simulated, r.plan.duration_s)
        if state is not None and not p.warming_up:
            fraction = state[0]
            eta = _duration(wall * (1 - fraction) / fraction) if fraction > 0 else "-"
            done += f" ({fraction:.0%}, ETA {eta})"
        speed = f" · {simulated / wall:,.0f}x real time" if wall >= 1 and simulated else ""
        return (
            f"SIMULATING {self.title}: {done}{speed} · sent {p.sent:,} · in flight "
            f"{p.in_flight:,} · ok {p.completed:,} · failed {p.failed:,}"
        )

    async def run(self) -> None:
        """Until cancelled, drawn by a thread: nothing of it waits on the virtual loop."""
        stop = threading.Event()
        live: Live | None = None
        if self.console.is_terminal:
            live = Live(
                get_renderable=lambda: Text(self.text()),
                console=self.console,
                refresh_per_second=2,
                transient=True,  # the summary is the result
            )
            live.start()
        else:
            threading.Thread(target=self._lines, args=(stop,), daemon=True).start()
        try:
            await asyncio.get_running_loop().create_future()  # no timer: the run sets its pace
        finally:
            stop.set()
            if live is not None:
                live.stop()

    def _lines(self, stop: threading.Event) -> None:
        while not stop.wait(self.line_every_s):
            self.console.print(self.text(), highlight=False, soft_wrap=True)
