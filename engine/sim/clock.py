"""The simulation's virtual clock: seconds that pass only when a simulated step says so."""

from __future__ import annotations


class VirtualClock:
    """Read by the simulated engine (request and step timestamps) and by the event loop that
    drives the load generator (loadgen/virtual_loop.py), which moves it forward to its next
    timer whenever nothing is ready to run."""

    def __init__(self, start: float = 0.0) -> None:
        self.now = start

    def time(self) -> float:
        return self.now

    def advance_to(self, t: float) -> None:
        if t > self.now:
            self.now = t
