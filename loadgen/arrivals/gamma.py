"""Gamma arrivals: vLLM's --burstiness, the gamma shape k with the mean gap 1/rate, so the
gaps' coefficient of variation is 1/sqrt(k) (1: Poisson, < 1 burstier, > 1 smoother)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from loadgen.arrivals.base import param, register
from loadgen.arrivals.rated import RatedProcess
from loadgen.arrivals.stats import gammainc


@register
@dataclass(frozen=True, slots=True)
class Gamma(RatedProcess):
    name = "gamma"
    description = "gamma gaps at --rate, shaped by --burstiness (vLLM's)"
    burstiness: float = param(1.0, "gamma shape: 1 Poisson, < 1 burstier", unset=None)

    def check(self) -> None:
        RatedProcess.check(self)
        if not (self.burstiness > 0 and math.isfinite(self.burstiness)):
            raise ValueError(f"burstiness must be > 0, got {self.burstiness}")

    def gaps_at(self, rng: np.random.Generator, n: int, rate: float | np.ndarray) -> np.ndarray:
        return rng.gamma(self.burstiness, 1.0 / (rate * self.burstiness), n)

    def gap_cdf(self) -> Callable[[np.ndarray], np.ndarray] | None:
        if self.rate == math.inf:
            return None
        return lambda x: gamma_cdf(x, self.burstiness, self.rate * self.burstiness)


def gamma_cdf(x: np.ndarray, shape: float, rate: float) -> np.ndarray:
    z = np.maximum(np.asarray(x, dtype=np.float64), 0.0) * rate
    return np.array([gammainc(shape, float(v)) for v in z])
