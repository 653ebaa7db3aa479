"""Poisson arrivals: exponential gaps, the memoryless load of many independent users."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from loadgen.arrivals.base import register
from loadgen.arrivals.rated import RatedProcess


@register
@dataclass(frozen=True, slots=True)
class Poisson(RatedProcess):
    name = "poisson"
    description = "exponential gaps at --rate (independent users)"

    def gaps_at(self, rng: np.random.Generator, n: int, rate: float | np.ndarray) -> np.ndarray:
        return rng.exponential(1.0 / rate, n)

    def gap_cdf(self) -> Callable[[np.ndarray], np.ndarray] | None:
        if self.rate == np.inf:
            return None
        return lambda x: 1.0 - np.exp(-self.rate * np.maximum(x, 0.0))
