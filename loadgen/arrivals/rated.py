"""The processes paced by a rate (--rate, or a ramp-up moving it request by request): their
gaps are drawn at a rate given per gap, so a ramp can reuse each one's sampler."""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from loadgen.arrivals.base import ArrivalProcess


@dataclass(frozen=True, slots=True)
class RatedProcess(ArrivalProcess):
    """A process with a mean rate in requests per second; inf sends everything at t=0 (with a
    concurrency cap: all queue for slots, as vLLM's --request-rate inf)."""

    rated: ClassVar[bool] = True
    rate: float = 1.0

    def check(self) -> None:
        if not self.rate > 0:
            raise ValueError(f"{self.name} arrivals need a rate > 0, got {self.rate}")

    def gaps(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return self.gaps_at(rng, n, self.rate)

    def gaps_at(self, rng: np.random.Generator, n: int, rate: float | np.ndarray) -> np.ndarray:
        """n gaps, gap i at `rate` (or `rate[i]`: a ramp-up)."""
        raise NotImplementedError

    def offsets(self, seed: int) -> Iterator[float]:
        if self.rate == math.inf:
            return itertools.repeat(0.0)
        return ArrivalProcess.offsets(self, seed)

    @property
    def mean_rate(self) -> float | None:
        return self.rate

    @classmethod
    def describe(cls, settings: Mapping[str, Any], per_s: str = "req/s") -> str:
        return f"{cls.name} {settings['rate']:g} {per_s}"

    @classmethod
    def check_run(cls, run: Any) -> None:
        paced = (run.rate, run.concurrency, run.ramp_up_strategy)
        if all(x is None for x in paced) and not run.classes:
            raise ValueError(
                f"{cls.name} arrivals need --rate R (or --concurrency C alone: a closed loop)"
            )
