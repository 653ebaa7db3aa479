"""When each request is sent: seeded arrival processes turned into absolute send offsets.

The whole schedule is computed before the first request goes out; the runner then sleeps to
absolute times, so a late wake-up never shifts every later request (relative sleeps drift)."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np

ARRIVALS = ("poisson", "gamma", "constant", "trace")


@dataclass(frozen=True, slots=True)
class Arrivals:
    """An open-loop arrival process. `rate` is requests per second; `burstiness` is the gamma
    shape (1: Poisson, < 1: burstier, > 1: smoother); a trace gives its own timestamps."""

    kind: str = "poisson"
    rate: float = 1.0
    burstiness: float = 1.0
    seed: int = 0
    trace_offsets: tuple[float, ...] = ()  # seconds since the trace's first request
    time_scale: float = 1.0  # multiplies trace gaps: 0.5 replays twice as fast
    ramp: Ramp | None = None  # the rate changes from request to request (then `rate` is moot)

    def __post_init__(self) -> None:
        if self.kind not in ARRIVALS:
            raise ValueError(f"arrival {self.kind!r}: expected one of {', '.join(ARRIVALS)}")
        if self.kind == "trace":
            if not self.trace_offsets:
                raise ValueError("trace arrivals need the trace's timestamps")
            if not (self.time_scale > 0 and math.isfinite(self.time_scale)):
                raise ValueError(f"time scale must be > 0, got {self.time_scale}")
        elif not self.rate > 0:  # inf: everything at t=0 (with a cap: all queue for slots)
            raise ValueError(f"{self.kind} arrivals need a rate > 0, got {self.rate}")
        if self.kind == "gamma" and not (self.burstiness > 0 and math.isfinite(self.burstiness)):
            raise ValueError(f"burstiness must be > 0, got {self.burstiness}")

    def offsets(self) -> Iterator[float]:
        """Absolute send offsets in seconds from the start of the run, first one at 0."""
        if self.kind == "trace":
            yield from (t * self.time_scale for t in self.trace_offsets)
            return
        if self.ramp is not None:
            yield from self._ramped(self.ramp)
            return
        if self.rate == math.inf:
            yield from itertools.repeat(0.0)
            return
        if self.kind == "constant":
            yield from (i / self.rate for i in itertools.count())
            return
        rng = np.random.default_rng(self.seed)
        t = 0.0
        while True:  # gaps drawn in blocks: the same seed gives the same schedule
            for gap in self._gaps(rng, 1024, self.rate):
                yield t
                t += float(gap)

    def _gaps(self, rng: np.random.Generator, n: int, rate: float | np.ndarray) -> np.ndarray:
        if self.kind == "constant":
            return np.broadcast_to(1.0 / np.asarray(rate, np.float64), (n,))
        if self.kind == "poisson":
            return rng.exponential(1.0 / rate, n)
        # Gamma with shape k and mean 1/rate: CV = 1/sqrt(k) (vLLM's definition of burstiness).
        return rng.gamma(self.burstiness, 1.0 / (rate * self.burstiness), n)

    def _ramped(self, ramp: Ramp) -> Iterator[float]:
        """vLLM's ramp-up: request i is drawn at the rate reached at progress i / (n - 1); the
        gap before it follows the arrival kind at that rate (the first request goes at 0)."""
        rates = ramp.rates()
        gaps = self._gaps(np.random.default_rng(self.seed), len(rates) - 1, rates[1:])
        yield 0.0
        yield from (float(t) for t in np.cumsum(gaps))

    def gap_cdf(self) -> Callable[[np.ndarray], np.ndarray] | None:
        """The CDF of the target inter-arrival time, for a one-sample KS test; None where the
        process has none (constant: a step; trace: compared with its own gaps instead)."""
        if self.rate == math.inf or self.ramp is not None:
            return None
        if self.kind == "poisson":
            return lambda x: 1.0 - np.exp(-self.rate * np.maximum(x, 0.0))
        if self.kind == "gamma":
            return lambda x: _gamma_cdf(x, self.burstiness, self.rate * self.burstiness)
        return None


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


def _gamma_cdf(x: np.ndarray, shape: float, rate: float) -> np.ndarray:
    z = np.maximum(np.asarray(x, dtype=np.float64), 0.0) * rate
    return np.array([gammainc(shape, float(v)) for v in z])


def gammainc(a: float, x: float) -> float:
    """The regularized lower incomplete gamma P(a, x): the series below a + 1, a continued
    fraction (modified Lentz) above, as Numerical Recipes (6.2) gives them; written here
    because the load generator needs no scipy or torch for its arrival check."""
    if x <= 0.0:
        return 0.0
    log_front = a * math.log(x) - x - math.lgamma(a)
    if x < a + 1.0:
        term = total = 1.0 / a
        n = a
        while abs(term) > abs(total) * 1e-15:
            n += 1.0
            term *= x / n
            total += term
        return min(1.0, total * math.exp(log_front))
    tiny = 1e-300
    b = x + 1.0 - a
    c, d = 1.0 / tiny, 1.0 / b
    h = d
    for i in range(1, 10_000):
        an = -i * (i - a)
        b += 2.0
        d = an * d + b
        d = tiny if abs(d) < tiny else d
        c = b + an / c
        c = tiny if abs(c) < tiny else c
        d = 1.0 / d
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < 1e-15:
            break
    return max(0.0, 1.0 - math.exp(log_front) * h)


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


def ks_statistic(samples: Sequence[float], cdf: Callable[[np.ndarray], np.ndarray]) -> float:
    """One-sample Kolmogorov-Smirnov D: the largest gap between the empirical and target CDF."""
    x = np.sort(np.asarray(samples, dtype=np.float64))
    n = len(x)
    if n == 0:
        return float("nan")
    f = cdf(x)
    upper = np.arange(1, n + 1) / n - f
    lower = f - np.arange(0, n) / n
    return float(max(upper.max(), lower.max()))


def ks_two_sample(a: Sequence[float], b: Sequence[float]) -> float:
    """Two-sample Kolmogorov-Smirnov D between two sets of gaps."""
    xa, xb = np.sort(np.asarray(a, np.float64)), np.sort(np.asarray(b, np.float64))
    if len(xa) == 0 or len(xb) == 0:
        return float("nan")
    grid = np.concatenate([xa, xb])
    fa = np.searchsorted(xa, grid, side="right") / len(xa)
    fb = np.searchsorted(xb, grid, side="right") / len(xb)
    return float(np.abs(fa - fb).max())


def ks_pvalue(d: float, n: float) -> float:
    """Asymptotic p-value of a KS statistic D over n samples (for two samples of sizes n1, n2
    pass n = n1*n2/(n1+n2)), with Stephens' small-sample correction."""
    if not n > 0 or math.isnan(d):
        return float("nan")
    lam = (math.sqrt(n) + 0.12 + 0.11 / math.sqrt(n)) * d
    if lam < 1e-3:
        return 1.0
    p = 2.0 * sum((-1) ** (k - 1) * math.exp(-2.0 * k * k * lam * lam) for k in range(1, 101))
    return min(1.0, max(0.0, p))
