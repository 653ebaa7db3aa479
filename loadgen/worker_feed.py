"""A closed loop's requests on a worker of `--workers N`: the driver hands them out
(loadgen/worker_slots.Dispenser), the worker keeps a few more than it has free slots and asks
for the next ones before those run out, so a freed slot seldom waits on the driver.

The limits hold over the whole run: the driver gives out no more than --num-requests, and
every worker stops taking at --duration from the one t0 they share. With --duration, the
requests a worker held when the time was up are never sent: their numbers stay unused."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from typing import Any

from loadgen.runner import LoadRunner
from loadgen.sessions import Session
from loadgen.workload import RequestSpec

DEPTH = 64  # at most this many held ahead; never more than the worker's slots


class Feed:
    """The requests a worker holds, in the driver's order; `indices` and `bases` map the
    worker's own numbering (the order it took them) to the run's."""

    def __init__(self, job: Any, ask: Callable[[int], None]) -> None:
        bases = job.record_bases or job.indices
        self.pending: deque[tuple[int, int, RequestSpec | Session]] = deque(
            zip(job.indices, bases, job.items, strict=True)
        )
        self.indices: list[int] = []
        self.bases: list[int] = []
        self.exhausted = job.exhausted
        self.depth = max(1, min(job.slots or 1, DEPTH))
        self.asked = 0  # requested and not yet given: one request out at a time
        self._ask = ask
        self._arrived: asyncio.Event | None = None

    def give(self, items: list[tuple[int, int, Any]], exhausted: bool) -> None:
        """The driver's answer (on the worker's event loop)."""
        self.pending.extend(items)
        self.exhausted = exhausted
        self.asked = 0
        if self._arrived is not None:
            self._arrived.set()
        self.top_up()

    def top_up(self) -> None:
        if not self.asked and not self.exhausted and len(self.pending) < self.depth:
            self.asked = self.depth - len(self.pending)
            self._ask(self.asked)

    async def take(self) -> RequestSpec | Session | None:
        """The next request, waiting for the driver if none is held; None: no more."""
        while not self.pending and not self.exhausted:
            self.top_up()
            self._arrived = self._arrived or asyncio.Event()
            self._arrived.clear()
            await self._arrived.wait()
        if not self.pending:
            return None
        index, base, item = self.pending.popleft()
        self.indices.append(index)
        self.bases.append(base)
        self.top_up()
        return item


class FedRunner(LoadRunner):
    """A LoadRunner whose closed loop takes its requests from a Feed."""

    def __init__(self, feed: Feed, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.feed = feed

    async def _take(self) -> RequestSpec | Session | None:
        return await self.feed.take()
