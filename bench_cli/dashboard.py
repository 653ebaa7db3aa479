"""The live view of a run (rich Live): progress, achieved vs target rate, rolling latencies,
throughput, and the hardware and engine telemetry with sparklines. It redraws from the event
loop a few times a second (no extra thread competing with the sender); without a terminal it
prints a plain progress line every few seconds instead."""

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
WINDOW = 200  # rolling latencies over the last requests that finished


def sparkline(values: list[float], width: int = 30) -> str:
    v = [x for x in values[-width:] if x is not None]
    if not v:
        return ""
    lo, hi = min(v), max(v)
    span = (hi - lo) or 1.0
    return "".join(SPARKS[int((x - lo) / span * (len(SPARKS) - 1))] for x in v)


def _pct(values: list[float]) -> str:
    if not values:
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
        refresh_s: float = 0.25,
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
        r = self.runner
        if not r.t0:
            return ""
        recent = now - r.t0 - 10.0
        tokens = sum(
            n
            for rec in r.records[-WINDOW:]
            if rec.ok
            for t, n in zip(rec.chunk_s, rec.chunk_tokens, strict=False)
            if t >= recent
        )
        window = min(10.0, max(now - r.t0, 1e-3))
        return f"{tokens / window:.1f} output tok/s (last 10 s)"

    def _latencies(self) -> list[str]:
        recs = [x for x in self.runner.records[-WINDOW:] if x.ok]
        ttft = [x.first_chunk_s - x.send_s for x in recs]
        e2e = [x.end_s - x.send_s for x in recs]
        itl = [g for x in recs for g in np.diff(x.chunk_s)]
        tpot = [
            (x.end_s - x.first_chunk_s) / (x.output_tokens - 1) for x in recs if x.output_tokens > 1
        ]
        return [_pct(ttft), _pct(itl), _pct(tpot), _pct(e2e)]

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
                    live.update(self.render(), refresh=True)
            finally:
                live.update(self.render(), refresh=True)
