"""The live view of a run (rich Live): progress, achieved vs target rate, rolling latencies,
throughput, and the hardware and engine telemetry with sparklines. It redraws from the event
loop twice a second, in a gap of the send schedule (no thread competing with the sender, no
send delayed by a redraw); without a terminal it prints a progress line every 5 s instead."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import numpy as np
from rich.console import Console, Group
from rich.live import Live
from rich.panel import Panel
from rich.table import Table

SPARKS = "▁▂▃▄▅▆▇█"
WINDOW = 100  # rolling latencies over the last requests that finished


def sparkline(values: list[float], width: int = 30) -> str:
    v = [x for x in values[-width:] if x is not None]
    if not v:
        return ""
    lo, hi = min(v), max(v)
    span = (hi - lo) or 1.0
    return "".join(SPARKS[int((x - lo) / span * (len(SPARKS) - 1))] for x in v)


def _pct(values: np.ndarray) -> str:
    if not len(values):
        return "-"
    p50, p99 = np.percentile(np.asarray(values) * 1e3, [50, 99])
    return f"{p50:.0f} / {p99:.0f}"


class Dashboard:
    def __init__(
        self,
        runner: Any,
        telemetry: Any | None,
        title: str,
        target_rate: float | None,
        console: Console,
        refresh_s: float = 0.5,
        line_every_s: float = 5.0,
    ) -> None:
        self.runner, self.telemetry, self.title = runner, telemetry, title
        self.target_rate = target_rate
        self.console = console
        self.refresh_s, self.line_every_s = refresh_s, line_every_s
        self.started = time.perf_counter()

    def render(self) -> Group:
        r = self.runner
        p = r.progress
        now = time.perf_counter()
        elapsed = now - r.t0 if r.t0 else 0.0
        status = "warming up" if p.warming_up else f"{elapsed:.1f} s"
        total = f"/{p.total}" if p.total else ""
        rate = p.sent / elapsed if elapsed > 0.5 else 0.0
        target = f" of {self.target_rate:g}" if self.target_rate else ""
        head = Group(  # short lines: an 80-column terminal must not wrap them
            f"[bold]{self.title}[/]",
            f"{status} · sent {p.sent}{total} · in flight {p.in_flight} · "
            f"[green]ok {p.completed}[/] · [red]failed {p.failed}[/]",
            f"rate {rate:.2f}{target} req/s · {self._throughput(now)}",
        )
        lat = Table(title="p50 / p99 ms, last requests", expand=False)
        for col in ("TTFT", "ITL", "TPOT", "E2E"):
            lat.add_column(col, justify="right")
        lat.add_row(*self._latencies())
        parts: list[Any] = [head, lat]
        tel = self._telemetry()
        if tel is not None:
            parts.append(tel)
        return Group(Panel(Group(*parts), title="servebench", border_style="blue"))

    def _throughput(self, now: float) -> str:
        """Output tokens of the requests that ended in the last 10 s (cheap: no chunk walk)."""
        r = self.runner
        if not r.t0:
            return ""
        since = now - r.t0 - 10.0
        tokens = 0
        for rec in reversed(r.records[-WINDOW:]):
            if (rec.end_s or 0) < since:
                break
            tokens += rec.output_tokens if rec.ok else 0
        window = min(10.0, max(now - r.t0, 1e-3))
        return f"{tokens / window:.1f} output tok/s (last 10 s)"

    def _latencies(self) -> list[str]:
        recs = [x for x in self.runner.records[-WINDOW:] if x.ok]
        if not recs:
            return ["-"] * 4
        send = np.fromiter((x.send_s for x in recs), float, len(recs))
        first = np.fromiter((x.first_chunk_s for x in recs), float, len(recs))
        end = np.fromiter((x.end_s for x in recs), float, len(recs))
        n = np.fromiter((x.output_tokens for x in recs), float, len(recs))
        many = n > 1
        tpot = (end[many] - first[many]) / (n[many] - 1)
        # ITL from the newest requests only: a few thousand gaps are plenty for p50/p99.
        itl = np.diff(np.concatenate([x.chunk_s for x in recs[-50:]]))
        itl = itl[itl >= 0]  # drop the jumps between requests
        return [_pct(first - send), _pct(itl), _pct(tpot), _pct(end - send)]

    def _telemetry(self) -> Table | None:
        rows = self.telemetry.rows[-60:] if self.telemetry is not None else []
        names = list(dict.fromkeys(k for row in rows for k in row if k != "t"))
        names = [k for k in names if not k.endswith("_total_mb")]
        if not names:
            return None
        table = Table(title="telemetry", expand=False)
        table.add_column("signal")
        table.add_column("now", justify="right")
        table.add_column("last 6 s")
        for name in names:
            series = [row[name] for row in rows if name in row]
            table.add_row(name, f"{series[-1]:.1f}", sparkline(series))
        return table

    def line(self) -> str:
        p = self.runner.progress
        elapsed = time.perf_counter() - self.runner.t0 if self.runner.t0 else 0.0
        ttft, itl, tpot, e2e = self._latencies()
        return (
            f"{self.title}: {elapsed:.0f} s, sent {p.sent}, ok {p.completed}, failed {p.failed}, "
            f"in flight {p.in_flight}; p50/p99 ms: TTFT {ttft}, ITL {itl}, TPOT {tpot}, E2E {e2e}"
        )

    async def _schedule_gap(self, need_s: float = 0.006, give_up_s: float = 0.5) -> None:
        """Wait for a gap in the send schedule long enough for a redraw (~4 ms), so drawing
        never delays a send. Poisson schedules have such gaps even at 1,000 req/s."""
        deadline = time.perf_counter() + give_up_s
        while (now := time.perf_counter()) < deadline:
            nxt = self.runner.next_send
            if nxt is None or nxt - now >= need_s:
                return
            await asyncio.sleep(max(0.0, nxt - now) + 0.0005)  # just after that send

    async def run(self) -> None:
        """Until cancelled: redraw (a terminal) or print a line every few seconds (a log)."""
        if not self.console.is_terminal:
            while True:
                await asyncio.sleep(self.line_every_s)
                self.console.print(self.line(), highlight=False, soft_wrap=True)
        with Live(self.render(), console=self.console, auto_refresh=False, transient=False) as live:
            try:
                while True:
                    await asyncio.sleep(self.refresh_s)
                    await self._schedule_gap()
                    live.update(self.render(), refresh=True)
            finally:
                live.update(self.render(), refresh=True)
