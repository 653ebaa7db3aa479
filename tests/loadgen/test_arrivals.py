"""Arrival processes: the seeded schedules follow their distributions (checked with our own KS
test, whose power and calibration are checked too), and bad processes are refused."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest

from loadgen.arrivals import (
    Arrivals,
    Ramp,
    ks_pvalue,
    ks_statistic,
    ks_two_sample,
    take_schedule,
)


def schedule(arrivals: Arrivals, n: int) -> list[float]:
    return take_schedule(arrivals.offsets(), n, None)


def gaps(arrivals: Arrivals, n: int) -> np.ndarray:
    """n gaps (from n + 1 offsets)."""
    return np.diff(schedule(arrivals, n + 1))


def ks_p(samples: np.ndarray, arrivals: Arrivals) -> float:
    cdf = arrivals.gap_cdf()
    assert cdf is not None
    return ks_pvalue(ks_statistic(samples, cdf), len(samples))


# ---- Poisson ----------------------------------------------------------------------------------


@pytest.mark.parametrize(("rate", "seed"), [(1.0, 0), (4.0, 1), (0.3, 2), (25.0, 3)])
def test_poisson_gaps_are_exponential_with_mean_one_over_rate(rate: float, seed: int) -> None:
    arrivals = Arrivals("poisson", rate=rate, seed=seed)
    x = gaps(arrivals, 5000)
    assert len(x) == 5000
    assert ks_p(x, arrivals) > 0.001
    assert x.mean() == pytest.approx(1 / rate, rel=0.05)
    assert (x > 0).all()


@pytest.mark.parametrize("kind", ["poisson", "gamma", "constant"])
def test_first_offset_is_zero_and_offsets_increase(kind: str) -> None:
    offsets = schedule(Arrivals(kind, rate=3.0, burstiness=0.5, seed=7), 3000)
    assert offsets[0] == 0.0
    assert (np.diff(offsets) > 0).all()


@pytest.mark.parametrize("kind", ["poisson", "gamma"])
def test_same_seed_gives_the_same_schedule_and_another_seed_another(kind: str) -> None:
    # 3000 requests: more than one block of 1024 gaps
    first = schedule(Arrivals(kind, rate=2.0, burstiness=0.5, seed=11), 3000)
    again = schedule(Arrivals(kind, rate=2.0, burstiness=0.5, seed=11), 3000)
    other = schedule(Arrivals(kind, rate=2.0, burstiness=0.5, seed=12), 3000)
    assert first == again
    assert other[0] == first[0] == 0.0
    assert all(a != b for a, b in zip(first[1:], other[1:], strict=True))


def test_schedule_is_a_prefix_of_a_longer_one() -> None:
    arrivals = Arrivals("poisson", rate=5.0, seed=3)
    assert schedule(arrivals, 2500) == schedule(arrivals, 5000)[:2500]


# ---- the KS test itself -----------------------------------------------------------------------


def test_ks_rejects_poisson_gaps_against_twice_the_rate() -> None:
    x = gaps(Arrivals("poisson", rate=2.0, seed=0), 5000)
    assert ks_p(x, Arrivals("poisson", rate=4.0)) < 1e-6


def test_ks_rejects_gamma_gaps_against_poisson_of_the_same_rate() -> None:
    x = gaps(Arrivals("gamma", rate=2.0, burstiness=0.25, seed=0), 5000)
    assert ks_p(x, Arrivals("poisson", rate=2.0)) < 1e-6


@pytest.mark.parametrize(("c", "alpha"), [(1.358, 0.05), (1.628, 0.01), (1.224, 0.10)])
def test_ks_pvalue_at_the_classic_critical_values(c: float, alpha: float) -> None:
    n = 10000
    assert ks_pvalue(c / math.sqrt(n), n) == pytest.approx(alpha, abs=0.01 * alpha / 0.05)


def test_ks_pvalue_limits() -> None:
    assert ks_pvalue(0.0, 100) == 1.0
    assert ks_pvalue(1.0, 100) < 1e-30
    assert ks_pvalue(0.05, 1000) > ks_pvalue(0.06, 1000) > ks_pvalue(0.06, 2000)
    assert math.isnan(ks_pvalue(0.1, 0))
    assert math.isnan(ks_pvalue(float("nan"), 100))


def test_ks_statistic_of_a_known_sample() -> None:
    # uniform CDF on [0, 1]; samples 0.1, 0.5, 0.6: D = max(1/3 - 0.1, 2/3 - 0.5, 1 - 0.6, ...)
    assert ks_statistic([0.6, 0.1, 0.5], lambda x: np.clip(x, 0, 1)) == pytest.approx(0.4)
    assert ks_statistic([0.9], lambda x: np.clip(x, 0, 1)) == pytest.approx(0.9)
    assert math.isnan(ks_statistic([], lambda x: x))


def test_ks_two_sample_of_the_same_process_does_not_reject() -> None:
    a = gaps(Arrivals("poisson", rate=3.0, seed=1), 4000)
    b = gaps(Arrivals("poisson", rate=3.0, seed=2), 6000)
    d = ks_two_sample(a, b)
    assert ks_pvalue(d, len(a) * len(b) / (len(a) + len(b))) > 0.05


def test_ks_two_sample_of_different_rates_rejects() -> None:
    a = gaps(Arrivals("poisson", rate=3.0, seed=1), 4000)
    b = gaps(Arrivals("poisson", rate=3.6, seed=2), 6000)
    d = ks_two_sample(a, b)
    assert ks_pvalue(d, len(a) * len(b) / (len(a) + len(b))) < 1e-6


def test_ks_two_sample_known_values() -> None:
    assert ks_two_sample([1.0, 2.0, 3.0], [1.0, 2.0, 3.0]) == 0.0
    assert ks_two_sample([1.0, 2.0], [3.0, 4.0]) == 1.0
    assert ks_two_sample([1.0, 2.0, 3.0, 4.0], [2.5]) == pytest.approx(0.5)
    assert math.isnan(ks_two_sample([], [1.0]))


# ---- gamma ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("burstiness", "rate", "seed"), [(0.25, 10.0, 0), (1.0, 2.0, 1), (4.0, 0.5, 2)]
)
def test_gamma_gaps_have_cv_one_over_sqrt_burstiness(
    burstiness: float, rate: float, seed: int
) -> None:
    arrivals = Arrivals("gamma", rate=rate, burstiness=burstiness, seed=seed)
    x = gaps(arrivals, 20000)
    assert x.mean() == pytest.approx(1 / rate, rel=0.05)
    assert x.std() / x.mean() == pytest.approx(1 / math.sqrt(burstiness), rel=0.10)
    assert ks_p(x, arrivals) > 0.001


def test_gamma_cdf_matches_the_exponential_at_burstiness_one() -> None:
    x = np.linspace(0.0, 5.0, 101)
    gamma = Arrivals("gamma", rate=1.5, burstiness=1.0).gap_cdf()
    poisson = Arrivals("poisson", rate=1.5).gap_cdf()
    assert gamma is not None and poisson is not None
    np.testing.assert_allclose(gamma(x), poisson(x), atol=1e-12)


@pytest.mark.parametrize("burstiness", [0.25, 4.0])
def test_gamma_cdf_median_of_samples_is_one_half(burstiness: float) -> None:
    """The CDF's shape and scale: at the empirical median of many draws it is ~0.5."""
    arrivals = Arrivals("gamma", rate=2.0, burstiness=burstiness)
    rng = np.random.default_rng(5)
    draws = rng.gamma(burstiness, 1 / (2.0 * burstiness), 50000)
    cdf = arrivals.gap_cdf()
    assert cdf is not None
    assert cdf(np.array([np.median(draws)]))[0] == pytest.approx(0.5, abs=0.01)
    assert cdf(np.array([-1.0, 0.0]))[0] == 0.0


def test_the_incomplete_gamma_matches_torchs() -> None:
    """The load generator's own P(a, x) (it needs no torch) against torch.special.gammainc,
    across the series and continued-fraction sides and shapes from very bursty to regular."""
    import torch

    from loadgen.arrivals import gammainc

    shapes = [0.05, 0.25, 1.0, 4.0, 30.0, 200.0]
    xs = [1e-6, 0.01, 0.3, 1.0, 2.5, 5.0, 20.0, 150.0, 400.0]
    ours = np.array([[gammainc(a, x) for x in xs] for a in shapes])
    a = torch.tensor(shapes, dtype=torch.float64)[:, None].expand(-1, len(xs))
    x = torch.tensor(xs, dtype=torch.float64)[None, :].expand(len(shapes), -1)
    np.testing.assert_allclose(ours, torch.special.gammainc(a, x).numpy(), atol=1e-12)


# ---- constant and trace -----------------------------------------------------------------------


@pytest.mark.parametrize("rate", [1.0, 4.0, 0.3])
def test_constant_offsets_are_i_over_rate(rate: float) -> None:
    offsets = schedule(Arrivals("constant", rate=rate), 500)
    assert offsets == [i / rate for i in range(500)]
    assert Arrivals("constant", rate=rate).gap_cdf() is None


@pytest.mark.parametrize("time_scale", [1.0, 0.5, 3.0])
def test_trace_offsets_are_scaled(time_scale: float) -> None:
    trace = (0.0, 0.25, 0.25, 1.5, 4.0)
    arrivals = Arrivals("trace", trace_offsets=trace, time_scale=time_scale)
    assert schedule(arrivals, 100) == [t * time_scale for t in trace]
    assert arrivals.gap_cdf() is None


@pytest.mark.parametrize(
    ("num_requests", "duration", "expected"),
    [
        (3, None, [0.0, 0.25, 0.25]),
        (None, 1.5, [0.0, 0.25, 0.25]),  # the offset at 1.5 is not before the end
        (None, 1.6, [0.0, 0.25, 0.25, 1.5]),
        (2, 10.0, [0.0, 0.25]),  # the count ends first
        (10, 1.0, [0.0, 0.25, 0.25]),  # the duration ends first
        (10, None, [0.0, 0.25, 0.25, 1.5, 4.0]),  # the trace ends first
        (0, None, []),
    ],
)
def test_take_schedule_stops_at_count_or_duration(
    num_requests: int | None, duration: float | None, expected: list[float]
) -> None:
    arrivals = Arrivals("trace", trace_offsets=(0.0, 0.25, 0.25, 1.5, 4.0))
    assert take_schedule(arrivals.offsets(), num_requests, duration) == expected


def test_take_schedule_duration_of_an_endless_process() -> None:
    offsets = take_schedule(Arrivals("poisson", rate=50.0, seed=0).offsets(), None, 20.0)
    assert offsets[-1] < 20.0
    assert len(offsets) == pytest.approx(1000, rel=0.1)


def test_take_schedule_needs_a_count_or_a_duration() -> None:
    with pytest.raises(ValueError, match="number of requests or a duration"):
        take_schedule(Arrivals("poisson").offsets(), None, None)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"kind": "poisson", "rate": 0.0},
        {"kind": "poisson", "rate": -1.0},
        {"kind": "poisson", "rate": math.nan},
        {"kind": "constant", "rate": 0.0},
        {"kind": "gamma", "rate": -2.0},
        {"kind": "gamma", "rate": 1.0, "burstiness": 0.0},
        {"kind": "gamma", "rate": 1.0, "burstiness": -0.5},
        {"kind": "uniform", "rate": 1.0},
        {"kind": "trace"},
        {"kind": "trace", "trace_offsets": (0.0, 1.0), "time_scale": 0.0},
        {"kind": "trace", "trace_offsets": (0.0, 1.0), "time_scale": -1.0},
    ],
)
def test_invalid_processes_are_refused(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        Arrivals(**kwargs)


@pytest.mark.parametrize("kind", ["poisson", "gamma", "constant"])
def test_an_infinite_rate_sends_everything_at_once(kind: str) -> None:
    """vLLM's `--request-rate inf`: with a concurrency cap, all requests queue for a slot."""
    arrivals = Arrivals(kind, rate=math.inf)
    assert take_schedule(arrivals.offsets(), 5, None) == [0.0] * 5
    assert arrivals.gap_cdf() is None


def test_trace_arrivals_ignore_the_rate() -> None:
    arrivals = Arrivals("trace", rate=0.0, trace_offsets=(0.0, 2.0))
    assert schedule(arrivals, 5) == [0.0, 2.0]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"kind": "gamma", "rate": 1.0, "burstiness": math.inf},
        {"kind": "trace", "trace_offsets": (0.0, 1.0), "time_scale": math.nan},
        {"kind": "trace", "trace_offsets": (0.0, 1.0), "time_scale": math.inf},
    ],
)
def test_non_finite_shapes_and_scales_are_refused(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        Arrivals(**kwargs)


# ---- ramp-up (vLLM's --ramp-up-strategy) -------------------------------------------------------


def test_a_constant_linear_ramp_spaces_request_i_at_its_own_rate() -> None:
    ramp = Ramp("linear", 1.0, 10.0, 10)
    assert np.allclose(ramp.rates(), np.arange(1, 11))
    offsets = list(Arrivals("constant", 10.0, ramp=ramp).offsets())
    assert len(offsets) == 10 and offsets[0] == 0.0
    assert np.allclose(np.diff(offsets), 1.0 / np.arange(2, 11))


def test_an_exponential_ramp_multiplies_the_rate_by_equal_steps() -> None:
    ramp = Ramp("exponential", 2.0, 32.0, 5)
    assert np.allclose(ramp.rates(), [2, 4, 8, 16, 32])


def test_a_poisson_ramp_sends_faster_at_the_end_than_at_the_start() -> None:
    n = 4000
    arrivals = Arrivals("poisson", 50.0, seed=3, ramp=Ramp("linear", 5.0, 50.0, n))
    offsets = list(arrivals.offsets())
    gaps = np.diff(offsets)
    assert len(offsets) == n
    first, last = gaps[: n // 10].mean(), gaps[-n // 10 :].mean()
    assert 1 / first == pytest.approx(7.3, rel=0.15)  # the first tenth's mean rate ~ 5..9.5
    assert 1 / last == pytest.approx(47.7, rel=0.15)
    assert offsets == list(
        Arrivals("poisson", 50.0, seed=3, ramp=Ramp("linear", 5.0, 50.0, n)).offsets()
    )
    assert arrivals.gap_cdf() is None  # no single target distribution to test against


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("sideways", 1.0, 2.0, 10), "expected linear or exponential"),
        (("exponential", 0.0, 2.0, 10), "start rate must be > 0 (exponential)"),
        (("linear", -1.0, 2.0, 10), "start rate must be >= 0"),
        (("linear", 1.0, 0.0, 10), "end rate must be > 0"),
        (("linear", 1.0, 2.0, 1), "at least 2 requests"),
    ],
)
def test_bad_ramps_are_refused(args: tuple, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        Ramp(*args)
