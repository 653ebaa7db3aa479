"""Constant arrivals: one request every 1/rate seconds, no randomness (the seed is moot)."""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from loadgen.arrivals.base import register
from loadgen.arrivals.rated import RatedProcess


@register
@dataclass(frozen=True, slots=True)
class Constant(RatedProcess):
    name = "constant"
    description = "equal gaps of 1/--rate seconds (no randomness)"

    def gaps_at(self, rng: np.random.Generator, n: int, rate: float | np.ndarray) -> np.ndarray:
        return np.broadcast_to(1.0 / np.asarray(rate, np.float64), (n,))

    def offsets(self, seed: int) -> Iterator[float]:
        if self.rate == math.inf:
            return itertools.repeat(0.0)
        # i / rate, not a running sum of gaps: no rounding drift over a long run
        return (i / self.rate for i in itertools.count())
