"""`bench gate`: fail CI when a run got worse than its baseline by more than a set limit.

Each metric's direction is known (throughput up is good, latency up is bad), never guessed
from its name; a metric that does not exist is unusable input (exit 2), not a pass."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Summary metrics where more is better; the latency distributions and failure counts are the
# other way round. Anything else cannot be gated.
HIGHER_IS_BETTER = {
    "request_throughput",
    "output_throughput",
    "total_token_throughput",
    "goodput",
    "completed",
}
LOWER_IS_BETTER = {"failed", "cancelled", "duration_s"}
DISTRIBUTIONS = {
    "ttft_s",
    "itl_s",
    "itl_per_token_s",
    "tpot_s",
    "e2e_s",
    "queue_s",
    "ttft_with_queue_s",
    "e2e_with_queue_s",
    "schedule_lag_s",
}
STATS = {"mean", "p50", "p90", "p95", "p99", "max"}


class GateInputError(ValueError):
    """Unusable input: a missing file or a metric that does not exist (exit code 2)."""


@dataclass(frozen=True, slots=True)
class Limit:
    metric: str  # a summary key, or DIST.STAT (e.g. ttft_s.p99)
    max_regression: float  # fraction: 0.05 = 5 % worse at most

    @classmethod
    def parse(cls, text: str) -> Limit:
        """`output_throughput=5%` or `ttft_s.p99=0.1` (a fraction)."""
        metric, sep, value = text.partition("=")
        if not sep:
            raise GateInputError(f"limit {text!r}: expected METRIC=PERCENT%, e.g. ttft_s.p99=10%")
        try:
            number = float(value.rstrip("%")) / (100 if value.endswith("%") else 1)
        except ValueError:
            raise GateInputError(f"limit {text!r}: {value!r} is not a percentage") from None
        if not number >= 0:
            raise GateInputError(f"limit {text!r}: must be >= 0")
        direction(metric.strip())  # fails now for an unknown metric
        return cls(metric.strip(), number)


def direction(metric: str) -> int:
    """+1 when higher is better, -1 when lower is better."""
    if metric in HIGHER_IS_BETTER:
        return 1
    if metric in LOWER_IS_BETTER:
        return -1
    dist, _, stat = metric.partition(".")
    if dist in DISTRIBUTIONS and stat in STATS:
        return -1
    known = sorted(HIGHER_IS_BETTER | LOWER_IS_BETTER) + [f"{d}.p99" for d in sorted(DISTRIBUTIONS)]
    raise GateInputError(f"metric {metric!r} cannot be gated; known: {', '.join(known)}, ...")


def load_summary(path: str | Path) -> dict[str, Any]:
    """A run folder (its summary.json) or a summary.json file."""
    p = Path(path)
    if p.is_dir():
        p = p / "summary.json"
    if not p.is_file():
        raise GateInputError(f"{path}: no summary.json there")
    try:
        return json.loads(p.read_text())
    except ValueError as e:
        raise GateInputError(f"{p}: not readable JSON: {e}") from e


def value_of(summary: dict[str, Any], metric: str, where: str) -> float:
    node: Any = summary
    for part in metric.split("."):
        if not isinstance(node, dict) or part not in node:
            raise GateInputError(f"{where}: has no metric {metric!r}")
        node = node[part]
    if not isinstance(node, int | float) or isinstance(node, bool):
        raise GateInputError(f"{where}: metric {metric!r} is {node!r}, not a number")
    return float(node)


@dataclass(frozen=True, slots=True)
class Check:
    metric: str
    baseline: float
    current: float
    change: float  # relative change, signed (+ = bigger)
    limit: float
    passed: bool


def check(limit: Limit, baseline: float, current: float) -> Check:
    """A regression is a change in the bad direction larger than the limit."""
    if baseline == 0:
        change = 0.0 if current == 0 else math.copysign(math.inf, current)
    else:
        change = (current - baseline) / abs(baseline)
    worse_by = -change * direction(limit.metric)
    return Check(
        limit.metric,
        baseline,
        current,
        change,
        limit.max_regression,
        worse_by <= limit.max_regression,
    )


def gate(current: str | Path, baseline: str | Path, limits: list[Limit]) -> list[Check]:
    cur, base = load_summary(current), load_summary(baseline)
    return [
        check(
            lim, value_of(base, lim.metric, str(baseline)), value_of(cur, lim.metric, str(current))
        )
        for lim in limits
    ]
