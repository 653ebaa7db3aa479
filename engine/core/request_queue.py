"""The scheduler's waiting queues: FCFS (a deque) or by priority (a heap keyed by priority,
arrival time and arrival order, as vLLM's priority queue is).

Adding, taking the first and removing are O(1) or O(log n), whatever the queue's length:
thousands of waiting sequences (n = 256 requests) must not make each insertion a scan.
Removal (an abort) only marks its entry; dead entries are dropped when they reach the
front."""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

from engine.core.request import Request


class _Entry:
    __slots__ = ("alive", "req")

    def __init__(self, req: Request) -> None:
        self.req = req
        self.alive = True


class RequestQueue:
    """Waiting requests in service order. `key`: the priority order (lowest first; ties in
    the order added); None: first come, first served, with `front` for requests that go
    ahead of everything (preempted ones, held-back siblings)."""

    def __init__(self, key: Callable[[Request], Any] | None = None) -> None:
        self.key = key
        self._fifo: deque[_Entry] = deque()
        self._heap: list[tuple[Any, int, _Entry]] = []
        self._order = itertools.count()  # ties in the heap: never compare entries
        self._live: dict[int, _Entry] = {}  # id(request) -> its live entry

    def add(self, req: Request, front: bool = False) -> None:
        entry = _Entry(req)
        old = self._live.get(id(req))
        if old is not None:  # already queued: it moves
            old.alive = False
        self._live[id(req)] = entry
        if self.key is not None:
            heapq.heappush(self._heap, (self.key(req), next(self._order), entry))
        elif front:
            self._fifo.appendleft(entry)
        else:
            self._fifo.append(entry)

    def peek(self) -> Request:
        """The first request to serve (IndexError if none)."""
        return self._front().req

    def pop(self) -> Request:
        entry = self._front()
        if self.key is not None:
            heapq.heappop(self._heap)
        else:
            self._fifo.popleft()
        del self._live[id(entry.req)]
        return entry.req

    def remove(self, req: Request) -> bool:
        """Take a request out (False if it was not queued): O(1)."""
        entry = self._live.pop(id(req), None)
        if entry is None:
            return False
        entry.alive = False
        if len(self._heap) + len(self._fifo) > 2 * len(self._live) + 64:
            self._compact()  # dead entries stay bounded (amortized O(1) a removal)
        return True

    def _compact(self) -> None:
        self._fifo = deque(e for e in self._fifo if e.alive)
        self._heap = [item for item in self._heap if item[2].alive]
        heapq.heapify(self._heap)

    def _front(self) -> _Entry:
        if self.key is not None:
            heap = self._heap
            while heap and not heap[0][2].alive:
                heapq.heappop(heap)
            if not heap:
                raise IndexError("the queue is empty")
            return heap[0][2]
        fifo = self._fifo
        while fifo and not fifo[0].alive:
            fifo.popleft()
        if not fifo:
            raise IndexError("the queue is empty")
        return fifo[0]

    def __contains__(self, req: object) -> bool:
        return id(req) in self._live and self._live[id(req)].req is req

    def __len__(self) -> int:
        return len(self._live)

    def __bool__(self) -> bool:
        return bool(self._live)

    def __iter__(self) -> Iterator[Request]:
        """In service order (sorts a priority queue: for inspection, not for each step)."""
        if self.key is not None:
            return (e.req for _, _, e in sorted(self._heap) if e.alive)
        return (e.req for e in self._fifo if e.alive)

    def __getitem__(self, i: int) -> Request:
        """The i-th in service order (0: `peek`, O(1); others walk the queue)."""
        if i == 0:
            return self.peek()
        return list(self)[i]
