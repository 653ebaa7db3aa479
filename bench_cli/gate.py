"""`bench gate`: fail CI when a run got worse than its baseline by more than a set limit.

Each metric's direction is known (throughput up is good, latency up is bad), never guessed
from its name; a metric that does not exist is unusable input (exit 2), not a pass."""

from __future__ import annotations

import json
import math
import numbers
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loadgen.metrics import DISTRIBUTIONS, STATS

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


@dataclass(slots=True)
class Results:
    """A run (one row) or a sweep (one row a point), metrics under their dotted names."""

    rows: list[dict[str, Any]]
    axes: list[str]  # the sweep's axes ([] for a run)
    where: str

    def key(self, row: dict[str, Any]) -> tuple[str, ...]:
        return tuple(f"{a}={row[a]}" for a in self.axes)


def load_results(path: str | Path) -> Results:
    """A run folder or summary.json, or a sweep folder (sweep.csv + sweep.json)."""
    p = Path(path)
    if (p / "sweep.csv").is_file():
        import pandas as pd

        try:
            axes = list(json.loads((p / "sweep.json").read_text())["axes"])
        except (OSError, ValueError, KeyError) as e:
            raise GateInputError(f"{path}: sweep.json is missing or unreadable: {e}") from e
        frame = pd.read_csv(p / "sweep.csv")
        return Results(frame.to_dict("records"), axes, str(path))
    summary = load_summary(p)
    return Results([_flatten(summary)], [], str(path))


def load_summary(path: str | Path) -> dict[str, Any]:
    """A run folder (its summary.json) or a summary.json file."""
    p = Path(path)
    if p.is_dir():
        p = p / "summary.json"
    if not p.is_file():
        raise GateInputError(f"{path}: no summary.json (a run) or sweep.csv (a sweep) there")
    try:
        return json.loads(p.read_text())
    except ValueError as e:
        raise GateInputError(f"{p}: not readable JSON: {e}") from e


def _flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out |= _flatten(v, f"{prefix}{k}.")
        else:
            out[f"{prefix}{k}"] = v
    return out


def value_of(row: dict[str, Any], metric: str, where: str) -> float:
    value = row.get(metric)
    if value is None or isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise GateInputError(f"{where}: has no metric {metric!r}")
    if math.isnan(value):
        raise GateInputError(f"{where}: metric {metric!r} is empty (NaN)")
    return float(value)


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


def gate(current: str | Path, baseline: str | Path, limits: list[Limit]) -> list[Check]:
    """Every limit at every point the two have in common (a run has one point)."""
    cur, base = load_results(current), load_results(baseline)
    if cur.axes != base.axes:
        raise GateInputError(f"{current} and {baseline} are not the same kind of sweep")
    base_rows = {base.key(r): r for r in base.rows}
    pairs = [(cur.key(r), r, base_rows.get(cur.key(r))) for r in cur.rows]
    if not any(b is not None for _, _, b in pairs):
        raise GateInputError(f"{current} and {baseline} share no sweep point")
    checks = []
    for key, row, brow in pairs:
        if brow is None:
            continue
        point = " ".join(key)
        for lim in limits:
            b = value_of(brow, lim.metric, f"{baseline} {point}".strip())
            c = value_of(row, lim.metric, f"{current} {point}".strip())
            cis = (brow.get(f"{lim.metric}.ci95"), row.get(f"{lim.metric}.ci95"))
            real = all(isinstance(x, numbers.Real) and not math.isnan(x) for x in cis)
            ci = (float(cis[0]), float(cis[1])) if real else None  # type: ignore[arg-type]
            checks.append(check(lim, b, c, point, ci))
    return checks


@dataclass(frozen=True, slots=True)
class Ratio:
    """`output_throughput[batching=continuous]/output_throughput[batching=static]>=2`: a
    ratio inside one sweep, at every value of its other axes; free of machine speed."""

    metric: str
    top: dict[str, str]
    bottom: dict[str, str]
    op: str
    bound: float
    text: str

    @classmethod
    def parse(cls, text: str) -> Ratio:
        m = re.fullmatch(
            r"\s*([\w.]+)\[([^\]]+)\]\s*/\s*([\w.]+)\[([^\]]+)\]\s*(>=|<=)\s*([\d.]+)\s*", text
        )
        if m is None or m[1] != m[3]:
            raise GateInputError(
                f"ratio {text!r}: expected METRIC[axis=value]/METRIC[axis=value]>=NUMBER"
            )
        direction(m[1])
        return cls(m[1], _selector(m[2], text), _selector(m[4], text), m[5], float(m[6]), text)

    def evaluate(self, results: Results) -> list[Check]:
        chosen = set(self.top) | set(self.bottom)
        unknown = chosen - set(results.axes)
        if unknown:
            raise GateInputError(f"ratio {self.text!r}: {sorted(unknown)} not axes of the sweep")
        rest = [a for a in results.axes if a not in chosen]
        groups: dict[tuple, dict[str, dict[str, Any]]] = {}
        for row in results.rows:
            for side, sel in (("top", self.top), ("bottom", self.bottom)):
                if all(str(row[k]) == v for k, v in sel.items()):
                    groups.setdefault(tuple(row[a] for a in rest), {})[side] = row
        checks = []
        for key, sides in groups.items():
            if len(sides) < 2:
                continue
            point = " ".join(f"{a}={v}" for a, v in zip(rest, key, strict=True))
            top = value_of(sides["top"], self.metric, results.where)
            bottom = value_of(sides["bottom"], self.metric, results.where)
            ratio = top / bottom if bottom else math.inf
            ok = ratio >= self.bound if self.op == ">=" else ratio <= self.bound
            checks.append(Check(self.text, point, bottom, top, ratio, self.bound, ok))
        if not checks:
            raise GateInputError(f"ratio {self.text!r}: no point has both sides in {results.where}")
        return checks


def _selector(text: str, whole: str) -> dict[str, str]:
    out = {}
    for part in text.split(","):
        key, sep, value = part.partition("=")
        if not sep:
            raise GateInputError(f"ratio {whole!r}: {part!r} is not axis=value")
        out[key.strip()] = value.strip()
    return out
