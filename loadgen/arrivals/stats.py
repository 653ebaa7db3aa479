"""Statistics for the arrival check, written here because the load generator needs no scipy
or torch: the one- and two-sample Kolmogorov-Smirnov statistics, their p-value, and the
regularized incomplete gamma behind the gamma process's CDF."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np


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
