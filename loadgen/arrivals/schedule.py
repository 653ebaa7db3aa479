"""When each request is sent: a registered arrival process and its seed (and, for a rated
one, a ramp of its rate) turned into absolute send offsets.

The whole schedule is computed before the first request goes out; the runner then sleeps to
absolute times, so a late wake-up never shifts every later request (relative sleeps drift)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from loadgen.arrivals.base import ArrivalProcess, arrival_process, param_fields
from loadgen.arrivals.ramp import Ramp
from loadgen.arrivals.rated import RatedProcess


class Arrivals:
    """One seeded schedule: `kind` names a registered process, `rate` and `params` its parameters
    (those of other processes are ignored, as a poisson schedule ignores a burstiness);
    `ramp` moves a rated process's rate from request to request (then `rate` is moot)."""

    __slots__ = ("process", "ramp", "seed")

    def __init__(
        self,
        kind: str = "poisson",
        rate: float | None = None,
        *,
        seed: int = 0,
        ramp: Ramp | None = None,
        **params: Any,
    ) -> None:
        cls = arrival_process(kind)
        if rate is not None:
            params["rate"] = rate
        known = set(param_fields()) | {"rate"} | {f for f in cls.__dataclass_fields__}
        unknown = set(params) - known
        if unknown:
            raise TypeError(f"{kind} arrivals: unknown parameters {sorted(unknown)}")
        own = {k: v for k, v in params.items() if k in cls.__dataclass_fields__}
        self.process: ArrivalProcess = cls(**own)
        if ramp is not None and not isinstance(self.process, RatedProcess):
            raise ValueError(f"a ramp-up moves a rate: {kind} arrivals have none")
        self.seed, self.ramp = seed, ramp

    @property
    def kind(self) -> str:
        return self.process.name

    @property
    def rate(self) -> float | None:
        """The target rate (None: a trace's own times)."""
        return self.process.mean_rate

    def offsets(self) -> Iterator[float]:
        """Absolute send offsets in seconds from the start of the run, first one at 0."""
        if self.ramp is not None:
            return self._ramped(self.ramp)
        return self.process.offsets(self.seed)

    def _ramped(self, ramp: Ramp) -> Iterator[float]:
        """vLLM's ramp-up: request i is drawn at the rate reached at progress i / (n - 1); the
        gap before it follows the arrival kind at that rate (the first request goes at 0)."""
        assert isinstance(self.process, RatedProcess)
        rates = ramp.rates()
        rng = np.random.default_rng(self.seed)
        gaps = self.process.gaps_at(rng, len(rates) - 1, rates[1:])
        yield 0.0
        yield from (float(t) for t in np.cumsum(gaps))

    def gap_cdf(self) -> Callable[[np.ndarray], np.ndarray] | None:
        """The CDF of the target inter-arrival time, for a one-sample KS test; None where the
        process has none (constant: a step; trace: compared with its own gaps instead; a
        ramp: the rate moves)."""
        return None if self.ramp is not None else self.process.gap_cdf()

    def __repr__(self) -> str:
        return f"Arrivals({self.process!r}, seed={self.seed}, ramp={self.ramp!r})"


def take_schedule(
    offsets: Iterator[float], num_requests: int | None, duration_s: float | None
) -> list[float]:
    """The first offsets up to a request count and/or a duration (whichever ends first)."""
    if num_requests is None and duration_s is None:
        raise ValueError("a schedule needs a number of requests or a duration")
    out: list[float] = []
    for t in offsets:
        if num_requests is not None and len(out) >= num_requests:
            break
        if duration_s is not None and t >= duration_s:
            break
        out.append(t)
    return out
