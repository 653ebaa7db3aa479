"""vLLM's ramp-up (--ramp-up-strategy): a request rate that moves from a start to an end over
the run's requests. Not a process of its own: it moves the rate of a rated one (poisson,
gamma, constant), which draws each gap at the rate reached by then."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

RAMPS = ("linear", "exponential")


@dataclass(frozen=True, slots=True)
class Ramp:
    """A request rate that moves from `start` to `end` req/s over `num_requests` requests,
    linearly or exponentially in the request's index (vLLM's --ramp-up-strategy)."""

    strategy: str
    start: float
    end: float
    num_requests: int

    def __post_init__(self) -> None:
        if self.strategy not in RAMPS:
            raise ValueError(f"ramp-up {self.strategy!r}: expected linear or exponential")
        low = 0.0 if self.strategy == "linear" else math.nextafter(0.0, 1.0)
        for name, value in (("start", self.start), ("end", self.end)):
            if not (math.isfinite(value) and value >= low):
                need = ">= 0" if self.strategy == "linear" else "> 0 (exponential)"
                raise ValueError(f"ramp-up {name} rate must be {need}, got {value}")
        if self.end <= 0:
            raise ValueError("the ramp-up end rate must be > 0")
        if self.num_requests < 2:
            raise ValueError("a ramp-up needs at least 2 requests")

    def rates(self) -> np.ndarray:
        progress = np.arange(self.num_requests) / (self.num_requests - 1)
        if self.strategy == "linear":
            return self.start + (self.end - self.start) * progress
        return self.start * (self.end / self.start) ** progress
