"""The load generator's event loop (uvloop where installed) and its sleep to an absolute
time: what keeps a schedule of thousands of requests a second on time."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")
SPIN_S = 0.0015  # measured: without the spin a 1,600 req/s schedule falls 100 ms behind


async def sleep_until(t: float) -> None:
    """Sleep to an absolute perf_counter() time. Event-loop timers wake up to ~1 ms late
    (epoll and libuv count whole milliseconds), so the last stretch yields in a tight loop:
    to the event loop, and to the OS (sched_yield), so that what shares the core (another
    worker, the driver, a server on the same machine) runs instead of waiting out the spin."""
    delay = t - time.perf_counter()
    if delay > SPIN_S:
        await asyncio.sleep(delay - SPIN_S)
    while time.perf_counter() < t:
        await asyncio.sleep(0)
        os.sched_yield()


def run_event_loop(main: Coroutine[Any, Any, T]) -> T:
    """asyncio.run on uvloop where it is installed: the client's per-request cost is mostly
    event-loop work, and uvloop's is about half of asyncio's (benchmarks/loadgen_capacity.py)."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    return uvloop.run(main)
