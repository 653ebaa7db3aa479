"""An asyncio event loop on a virtual clock: whenever nothing is ready to run, time jumps to
the next timer instead of waiting for it. The load generator's own code (arrival sleeps,
closed loops, conversations' think time, caps) runs unchanged against a simulated engine,
and a simulated hour passes in the seconds its Python work takes."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import selectors
import time
from collections.abc import Iterator
from typing import Any

from engine.sim.clock import VirtualClock


class _JumpSelector(selectors.DefaultSelector):
    """Polls real file descriptors (the loop's self-pipe: signals such as Ctrl-C) without
    blocking; a timeout moves the virtual clock forward instead of sleeping."""

    POLL_S = 0.01  # of wall time between polls: a syscall each loop turn was ~4 % of a run

    def __init__(self, clock: VirtualClock) -> None:
        super().__init__()
        self.clock = clock
        self._polled = time.perf_counter()

    def select(self, timeout: float | None = None) -> list[Any]:
        if timeout is None:  # no timer at all: only another thread or a signal can wake us
            return super().select(None)
        ready: list[Any] = []
        now = time.perf_counter()
        if now - self._polled >= self.POLL_S:
            self._polled = now
            ready = super().select(0)
        if not ready and timeout > 0:
            self.clock.now += timeout
        return ready


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    def __init__(self, clock: VirtualClock) -> None:
        self.clock = clock
        super().__init__(_JumpSelector(clock))

    def time(self) -> float:
        return self.clock.now

    def next_event(self) -> float:
        """When anything else can next happen on this loop: now if a callback is ready,
        else its earliest timer (inf: none)."""
        if self._ready:  # type: ignore[attr-defined]
            return self.clock.now
        timers = (h.when() for h in self._scheduled if not h.cancelled())  # type: ignore[attr-defined]
        return min(timers, default=float("inf"))


@contextlib.contextmanager
def without_cyclic_gc() -> Iterator[None]:
    """No automatic cyclic collection while a simulated run plans, runs and reports. An hour
    makes ~50 million long-lived containers (prompts, token lists, records, token times) and
    every young collection walks each of them once more. The run makes no cyclic garbage of
    note: its peak memory is the same with collection or without. Figures:
    docs/results/2026-12-05-sim-speed.md."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def run_virtual(main: Any, clock: VirtualClock) -> Any:
    """asyncio.run on a loop whose time is `clock`."""
    with asyncio.Runner(loop_factory=lambda: VirtualTimeLoop(clock)) as runner:
        return runner.run(main)
