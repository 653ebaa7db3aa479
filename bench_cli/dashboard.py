"""The live view of a run (rich Live): a progress bar with ETA, achieved vs target rate,
rolling latencies, throughput, and the hardware and engine telemetry as sparklines with their
units. It redraws from the event loop twice a second, in a gap of the send schedule (no thread
competing with the sender, no send delayed by a redraw); without a terminal it prints a
progress line every 5 s instead."""

from __future__ import annotations

import asyncio
import time
from collections import deque
from typing import Any

import numpy as np
from rich.console import Console, Group
from rich.live import Live
from rich.panel import Panel
from rich.progress_bar import ProgressBar
from rich.table import Table

from bench_cli.signals import signal
from loadgen.machine_cpu import STEAL_WARN, steal_share

SPARKS = "▁▂▃▄▅▆▇█"
WINDOW = 100  # rolling latencies over the last requests that finished
MIN_GAP_S = 0.006  # the least gap before a send that a redraw may use
TREND = 20  # sparkline width: the telemetry table must fit an 80-column terminal


def sparkline(values: list[float], width: int = 30) -> str:
    v = [x for x in values[-width:] if x is not None]
    if not v:
        return ""
    lo, hi = min(v), max(v)
    span = (hi - lo) or 1.0
    return "".join(SPARKS[int((x - lo) / span * (len(SPARKS) - 1))] for x in v)


def _duration(seconds: float) -> str:
    s = round(seconds)
    return f"{s} s" if s < 60 else f"{s // 60}m{s % 60:02d}s" if s < 3600 else f"{s / 3600:.1f} h"


def progress(
    done: int,
    total: int | None,
    elapsed_s: float,
    duration_s: float | None,
    schedule_left_s: float = 0.0,
) -> tuple[float, str] | None:
    """(fraction done, "50/100 requests · ETA 10 s"): by requests ended when the run has a
    count, by the clock when it has a duration (whichever is further along), None with
    neither. The request ETA extrapolates the pace so far, but never ends before the send
    schedule does."""
    options = []
    if total:
        eta = elapsed_s * (total - done) / done if done else None
        if eta is not None:
            eta = max(eta, schedule_left_s)
        text = f"{done}/{total} requests · ETA {'-' if eta is None else _duration(eta)}"
        options.append((min(done / total, 1.0), text))
    if duration_s:
        left = max(duration_s - elapsed_s, 0.0)
        text = f"{elapsed_s:.0f}/{duration_s:g} s · ETA {_duration(left)}"
        options.append((min(elapsed_s / duration_s, 1.0), text))
    return max(options, key=lambda o: o[0]) if options else None


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
        self.tok_s: list[float] = []  # output tok/s at each redraw, for its sparkline
        self._redraw_s: deque[float] = deque(maxlen=20)  # the last redraws' durations
        self._nonzero: set[str] = set()  # signals seen away from zero (NaN: not seen)
        self._seen_rows = 0  # telemetry rows already looked at for that
        # machine_steal_percent so far, summed, and its samples: the row shows once it warns
        self._steal_sum, self._steal_samples = 0.0, 0

    def render(self) -> Group:
        r = self.runner
        p = r.progress
        now = time.perf_counter()
        elapsed = now - r.t0 if r.t0 else 0.0
        status = "warming up" if p.warming_up else f"{elapsed:.1f} s"
        total = f"/{p.total}" if p.total else ""
        rate = p.sent / elapsed if elapsed > 0.5 else 0.0
        target = f" of {self.target_rate:g}" if self.target_rate else ""
        tok_s = self._throughput(now)
        if r.t0:
            self.tok_s = [*self.tok_s[-59:], tok_s]
        head = Group(  # short lines: an 80-column terminal must not wrap them
            f"[bold]{self.title}[/]",
            f"{status} · sent {p.sent}{total} · in flight {p.in_flight} · "
            f"[green]ok {p.completed}[/] · [red]failed {p.failed}[/]",
            f"rate {rate:.2f}{target} req/s · {tok_s:.1f} output tok/s (last 10 s)"
            if r.t0
            else f"rate {rate:.2f}{target} req/s",
        )
        parts: list[Any] = [head]
        bar = self._progress(elapsed)
        if bar is not None and not p.warming_up:
            parts.append(bar)
        lat = Table(title="p50 / p99 ms, last requests", expand=False)
        for col in ("TTFT", "ITL", "TPOT", "E2E"):
            lat.add_column(col, justify="right")
        lat.add_row(*self._latencies())
        parts.append(lat)
        tel = self._telemetry()
        if tel is not None:
            parts.append(tel)
        return Group(Panel(Group(*parts), title="servebench", border_style="blue"))

    def _progress_state(self, elapsed: float) -> tuple[float, str] | None:
        r = self.runner
        plan = getattr(r, "plan", None)
        offsets = getattr(plan, "offsets", None)
        schedule_left = offsets[-1] - elapsed if offsets else 0.0
        done = r.progress.completed + r.progress.failed
        duration = getattr(plan, "duration_s", None)
        return progress(done, r.progress.total, elapsed, duration, schedule_left)

    def _progress(self, elapsed: float) -> Table | None:
        """A bar with the requests (or seconds) done and the time left."""
        state = self._progress_state(elapsed)
        if state is None:
            return None
        fraction, text = state
        row = Table.grid(padding=(0, 1))
        row.add_row(ProgressBar(total=1.0, completed=fraction, width=30), text)
        return row

    def _throughput(self, now: float) -> float:
        """Output tokens/s of the requests that ended in the last 10 s (cheap: no chunk walk)."""
        r = self.runner
        if not r.t0:
            return 0.0
        since = now - r.t0 - 10.0
        tokens = 0
        for rec in reversed(r.records[-WINDOW:]):
            if (rec.end_s or 0) < since:
                break
            tokens += rec.output_tokens if rec.ok else 0
        window = min(10.0, max(now - r.t0, 1e-3))
        return tokens / window

    def _latencies(self) -> list[str]:
        recs = [x for x in self.runner.records[-WINDOW:] if x.ok]
        if not recs:
            return ["-"] * 4
        send = np.fromiter((x.send_s for x in recs), float, len(recs))
        first = np.fromiter((x.first_chunk_s for x in recs), float, len(recs))
        end = np.fromiter((x.end_s for x in recs), float, len(recs))
        n = np.fromiter((x.tokens_per_sequence for x in recs), float, len(recs))
        many = n > 1
        tpot = (end[many] - first[many]) / (n[many] - 1)
        # ITL from the newest requests only: a few thousand gaps are plenty for p50/p99.
        # Each request's own gaps: the time between one request's end and the next one's first
        # chunk is no inter-token latency (it once showed a 370 ms ITL p99 at 5 req/s).
        itl = np.array([gap for x in recs[-50:] for gap, _ in x.gaps()])
        return [_pct(first - send), _pct(itl), _pct(tpot), _pct(end - send)]

    def _telemetry(self) -> Table | None:
        """A sparkline per signal with its unit (CPU % is per core: 200 is two cores busy)."""
        all_rows = self.telemetry.rows if self.telemetry is not None else []
        for row in all_rows[self._seen_rows :]:
            self._nonzero.update(k for k, v in row.items() if v == v and v != 0)
            if "machine_steal_percent" in row:
                self._steal_sum += row["machine_steal_percent"]
                self._steal_samples += 1
        self._seen_rows = len(all_rows)
        rows = all_rows[-60:]
        names = list(dict.fromkeys(k for row in rows for k in row if k != "t"))
        # a signal zero for the whole run so far (speculation on a run without it) is a row
        # of nothing: left out, so the panel fits a 100x30 pane; so is the hypervisor's
        # steal until there is enough of it that the run will warn
        shown = self._nonzero - ({"machine_steal_percent"} if not self._steal_warns() else set())
        names = [k for k in names if not k.endswith("_total_mb") and k in shown]
        if not names and not self.tok_s:
            return None
        span = rows[-1]["t"] - rows[max(0, len(rows) - TREND)]["t"] if len(rows) > 1 else 0.0
        table = Table(title=f"telemetry, last {span:.0f} s", expand=False)
        table.add_column("signal")
        table.add_column("now", justify="right")
        table.add_column("unit")
        table.add_column("trend")
        if self.tok_s:
            table.add_row(
                "output", f"{self.tok_s[-1]:.1f}", "tok/s (10 s)", sparkline(self.tok_s, TREND)
            )
        for name in names:
            series = [row[name] for row in rows if name in row]
            sig = signal(name)
            label = sig.label.removeprefix("engine ")  # the engine's gauges, by name
            table.add_row(label, f"{series[-1]:.1f}", sig.unit, sparkline(series, TREND))
        return table

    def _steal_warns(self) -> bool:
        cpus = getattr(self.telemetry, "machine_cpus", None)
        if not self._steal_samples or cpus is None:
            return False
        return steal_share(self._steal_sum / self._steal_samples, cpus) >= STEAL_WARN

    def line(self) -> str:
        p = self.runner.progress
        elapsed = time.perf_counter() - self.runner.t0 if self.runner.t0 else 0.0
        ttft, itl, tpot, e2e = self._latencies()
        state = self._progress_state(elapsed)
        eta = f", {state[1]}" if state and not p.warming_up else ""
        return (
            f"{self.title}: {elapsed:.0f} s{eta}, sent {p.sent}, ok {p.completed}, "
            f"failed {p.failed}, in flight {p.in_flight}; "
            f"p50/p99 ms: TTFT {ttft}, ITL {itl}, TPOT {tpot}, E2E {e2e}"
        )

    def need_s(self) -> float:
        """The gap before the next send a redraw needs: twice the slowest of the last ones,
        at least 6 ms. A redraw takes ~4 ms on an idle core, but 6-22 ms beside the bundled
        engine's threads on 2 cores (measured with a 2-thread torch loop): a fixed 6 ms let
        redraws run into sends, and `make demo` came out INVALID (p99 lag 13.4 ms)."""
        return max(MIN_GAP_S, 2 * max(self._redraw_s, default=0.0))

    async def _schedule_gap(self, need_s: float = 0.006, give_up_s: float = 0.5) -> None:
        """Wait for a gap in the send schedule long enough for a redraw (`need_s`), so
        drawing never delays a send. Poisson schedules have such gaps even at 1,000 req/s."""
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
                    await self._schedule_gap(self.need_s())
                    t = time.perf_counter()
                    live.update(self.render(), refresh=True)
                    self._redraw_s.append(time.perf_counter() - t)
            finally:
                live.update(self.render(), refresh=True)
