"""`bench gate`: fail CI when a run got worse than its baseline by more than a set limit.

Each metric's direction is known (throughput up is good, latency up is bad), never guessed
from its name; a metric that does not exist is unusable input (exit 2), not a pass."""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Any

import numpy as np

from bench_cli.gate.results import GateInputError, Results, value_of
from loadgen import metric_registry
from loadgen.metrics import STATS


@dataclass(frozen=True, slots=True)
class Limit:
    metric: str  # a summary key, or DIST.STAT (e.g. ttft_s.p99)
    max_regression: float  # fraction: 0.05 = 5 % worse at most

    @classmethod
    def parse(cls, text: str) -> Limit:
        """`output_throughput=5%` or `ttft_s.p99=0.1` (a fraction). A bare number above 1
        is refused: `40` read as a fraction is 4,000 % and passes anything."""
        metric, sep, value = text.partition("=")
        if not sep:
            raise GateInputError(f"limit {text!r}: expected METRIC=PERCENT%, e.g. ttft_s.p99=10%")
        value = value.strip()
        percent = value.endswith("%")
        try:
            number = float(value.removesuffix("%").strip())
        except ValueError:
            raise GateInputError(f"limit {text!r}: {value!r} is not a percentage") from None
        if not number >= 0:
            raise GateInputError(f"limit {text!r}: must be >= 0")
        if not percent and number > 1:
            raise GateInputError(
                f"limit {text!r} is ambiguous: write {metric.strip()}={value}% for {value} "
                f"percent, or a fraction such as {metric.strip()}={number / 100:g} "
                f"(= {number:g}%)"
            )
        number /= 100 if percent else 1
        direction(metric.strip())  # fails now for an unknown metric
        return cls(metric.strip(), number)


def direction(metric: str) -> int:
    """+1 when higher is better, -1 when lower is better: the metric registry's direction of a
    scalar, or of a distribution's statistic (`ttft_s.p99`)."""
    m = metric_registry.metric(metric)
    if m is None:  # a distribution's statistic?
        dist, _, stat = metric.partition(".")
        d = metric_registry.metric(dist)
        m = d if d is not None and d.kind == "distribution" and stat in STATS else None
    elif m.kind == "distribution":
        raise GateInputError(f"metric {metric!r} is a distribution: name a statistic, {metric}.p99")
    if m is None or not m.sign:
        why = " (neither higher nor lower is better)" if m is not None else ""
        raise GateInputError(f"metric {metric!r} cannot be gated{why}; known: {_known()}, ...")
    return m.sign


def _known() -> str:
    """The gateable metrics, for an error message: scalars, then each distribution's p99."""
    gated = [m for m in metric_registry.METRICS.values() if m.sign]
    scalars = sorted(m.name for m in gated if m.kind != "distribution")
    return ", ".join(scalars + [f"{m.name}.p99" for m in gated if m.kind == "distribution"])


# What a run was measured under: two runs that differ here were not given the same load (or


@dataclass(frozen=True, slots=True)
class Check:
    metric: str
    point: str  # the sweep point ("" for a run)
    baseline: float
    current: float
    change: float  # relative change, signed (+ = bigger)
    limit: float
    passed: bool
    noise: bool = False  # worse than the limit, but the 95 % confidence intervals overlap
    note: str = ""  # why a check failed that no number says


def check(
    limit: Limit,
    baseline: float,
    current: float,
    point: str = "",
    ci: tuple[float, float] | None = None,
) -> Check:
    """A regression is a change in the bad direction larger than the limit, unless both sides
    were repeated and their confidence intervals (half-widths `ci`) overlap: then it is noise."""
    if baseline == 0:
        change = 0.0 if current == 0 else math.copysign(math.inf, current)
    else:
        change = (current - baseline) / abs(baseline)
    worse_by = -change * direction(limit.metric)
    passed = worse_by <= limit.max_regression
    noise = not passed and ci is not None and abs(current - baseline) <= ci[0] + ci[1]
    return Check(
        limit.metric, point, baseline, current, change, limit.max_regression, passed or noise, noise
    )


def untrusted(row: dict[str, Any], where: str, allow_invalid: bool = False) -> str | None:
    """Why a row's numbers cannot be compared: nothing succeeded (its latencies are empty,
    its throughputs 0 for a reason no limit names), or it flagged itself INVALID (the load
    offered was not the load asked for; a sweep row's `valid` is the share of its runs
    that were). None: usable."""
    completed = row.get("completed")
    if isinstance(completed, numbers.Real) and completed == 0:
        failed = row.get("failed")
        why = f": {failed:g} failed" if isinstance(failed, numbers.Real) and failed else ""
        return f"{where}: no request succeeded{why}; nothing was measured"
    if not allow_invalid and is_invalid(row):
        return (
            f"{where} is INVALID (the load generator did not keep to its schedule: the load "
            "offered was not the load asked for); pass --allow-invalid to compare it anyway"
        )
    return None


def is_invalid(row: dict[str, Any]) -> bool:
    valid = row.get("valid")
    if isinstance(valid, bool | np.bool_):
        return not valid
    return isinstance(valid, numbers.Real) and not math.isnan(valid) and valid < 1


def invalid_labels(results: Results) -> list[str]:
    """Where the results flagged themselves INVALID, for a warning when compared anyway."""
    return [f"{results.where} {results.label(r)}".strip() for r in results.rows if is_invalid(r)]


def refused(metric: str, point: str, limit: float, notes: list[str]) -> Check:
    nan = math.nan
    return Check(metric, point, nan, nan, nan, limit, False, note="; ".join(notes))


def compare(
    current: Results, baseline: Results, limits: list[Limit], allow_invalid: bool = False
) -> list[Check]:
    """Every limit at every point the two have in common (a run has one point); a point
    where either side cannot be trusted (`untrusted`) fails with the reason."""
    if current.axes != baseline.axes:
        raise GateInputError(f"{current.where} and {baseline.where} are not the same kind of sweep")
    base_rows = _by_point(baseline)
    pairs = [(row, base_rows.get(key)) for key, row in _by_point(current).items()]
    if not any(b is not None for _, b in pairs):
        raise GateInputError(f"{current.where} and {baseline.where} share no sweep point")
    checks = []
    for row, brow in pairs:
        if brow is None:
            continue
        point = current.label(row)
        sides = (("baseline", baseline, brow), ("current", current, row))
        notes = [
            n
            for side, res, r in sides
            if (n := untrusted(r, f"{side} {res.where} {point}".strip(), allow_invalid))
        ]
        if notes:
            checks += [refused(lim.metric, point, lim.max_regression, notes) for lim in limits]
            continue
        for lim in limits:
            b = value_of(brow, lim.metric, f"{baseline.where} {point}".strip())
            c = value_of(row, lim.metric, f"{current.where} {point}".strip())
            cis = (brow.get(f"{lim.metric}.ci95"), row.get(f"{lim.metric}.ci95"))
            real = all(isinstance(x, numbers.Real) and not math.isnan(x) for x in cis)
            ci = (float(cis[0]), float(cis[1])) if real else None  # type: ignore[arg-type]
            checks.append(check(lim, b, c, point, ci))
    return checks


def _by_point(results: Results) -> dict[tuple, dict[str, Any]]:
    """Rows by their point; a repeated point is one row (its runs averaged), so two rows with
    the same settings cannot be told apart: which one to judge would be a guess."""
    out: dict[tuple, dict[str, Any]] = {}
    for row in results.rows:
        key = results.key(row)
        if key in out:
            raise GateInputError(
                f"{results.where}: two rows for the point {results.label(row)!r}; "
                "a sweep lists each point once"
            )
        out[key] = row
    return out


def noise_note(judged: list[Results]) -> str | None:
    """Without repeats there is no confidence interval, so a change may be noise: two identical
    single runs have differed by 40 % in TTFT p99."""
    single = [r.where for r in judged if r.runs < 2]
    if not single:
        return None
    return (
        f"no noise estimate: {' and '.join(dict.fromkeys(single))} has one run per point, so a "
        "change may be run-to-run noise; `bench sweep --repeat N` (N >= 3) gives 95% CIs"
    )
