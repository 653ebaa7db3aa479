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

import numpy as np

from bench_cli.sweep.grid import grid
from loadgen import metric_registry
from loadgen.arrivals import arrival_keys
from loadgen.config import RunConfig
from loadgen.metrics import STATS


class GateInputError(ValueError):
    """Unusable input: a missing file or a metric that does not exist (exit code 2)."""


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
# judged by the same SLO), so their numbers differ for reasons other than the server. The
# arrival processes' own keys (burstiness, a trace's file and time scale, ...) come from
# their registry (loadgen/arrivals), after the rate.
_LOAD_KEYS = (
    "endpoint",
    "arrival",
    "rate",
    "concurrency",
    "num_requests",
    "duration",
    "input_len",
    "output_len",
    "dataset",
    "shared_prefix_len",
    "num_prefix_groups",
    "ignore_eos",
    "slo",
    "ramp_up_strategy",
    "ramp_up_start_rps",
    "ramp_up_end_rps",
    "n",
    "turns",
    "think_time",
    "classes",
)


def load_keys() -> tuple[str, ...]:
    """The load keys, every registered arrival process's among them."""
    return (*_LOAD_KEYS[:3], *arrival_keys(), *_LOAD_KEYS[3:])


@dataclass(slots=True)
class Results:
    """A run (one row) or a sweep (one row a point, its repeats averaged), metrics under their
    dotted names."""

    rows: list[dict[str, Any]]
    axes: list[str]  # the sweep's axes ([] for a run)
    where: str
    load: dict[str, Any]  # load_keys() the rows share ({} when the files do not say)
    runs: int  # the fewest runs behind a row: 1 means no confidence interval

    def key(self, row: dict[str, Any]) -> tuple[tuple[str, Any], ...]:
        return tuple((a, typed(row[a])) for a in self.axes)

    def label(self, row: dict[str, Any]) -> str:
        return " ".join(f"{a}={row[a]}" for a in self.axes)


def typed(value: Any) -> tuple[str, Any]:
    """A setting as the thing it means, so a CSV's `1.0` is the selector's `1` and pandas'
    `True` is `true`: numbers compare as numbers, booleans case-insensitively, the rest as text.
    The tag keeps True apart from 1."""
    if isinstance(value, bool | np.bool_):
        return ("bool", bool(value))
    if isinstance(value, numbers.Real):
        return ("number", float(value))
    text = str(value).strip()
    if text.lower() in ("true", "false"):
        return ("bool", text.lower() == "true")
    try:
        return ("number", float(text))
    except ValueError:
        return ("text", text)


def load_results(path: str | Path) -> Results:
    """A run folder or summary.json, or a sweep folder (sweep.csv + sweep.json)."""
    p = Path(path)
    if (p / "sweep.csv").is_file():
        import pandas as pd

        try:
            plan = json.loads((p / "sweep.json").read_text())
            axes = list(plan["axes"])
        except (OSError, ValueError, KeyError) as e:
            raise GateInputError(f"{path}: sweep.json is missing or unreadable: {e}") from e
        rows = pd.read_csv(p / "sweep.csv").to_dict("records")
        counts = [r.get("runs") for r in rows]  # a row's repeats, averaged into it
        runs = min((int(n) for n in counts if isinstance(n, numbers.Real) and n == n), default=1)
        return Results(rows, axes, str(path), _sweep_load(plan), runs)
    summary = load_summary(p)
    run = (summary.get("config") or {}).get("run") or {}
    load = {k: run.get(k) for k in load_keys()} if run else {}
    return Results([_flatten(summary)], [], str(path), load, 1)


def _sweep_load(plan: dict[str, Any]) -> dict[str, Any]:
    """The load every point shared: the profile's (defaults where it is silent), less what an
    axis varies (points are matched on those)."""
    profile = plan.get("profile")
    if not isinstance(profile, dict) or not isinstance(plan["axes"], dict):
        return {}
    varied = set(plan["axes"]) | {k for p in grid(plan["axes"]) for k in p.settings}
    defaults = RunConfig()
    return {k: profile.get(k, getattr(defaults, k)) for k in load_keys() if k not in varied}


def load_differences(current: Results, baseline: Results) -> list[str]:
    """The load settings in which the two differ, as `key: baseline -> current`."""
    if not current.load or not baseline.load:
        return []
    return [
        f"{k}: {baseline.load.get(k)} -> {current.load.get(k)}"
        for k in load_keys()
        if (k in current.load or k in baseline.load)
        and typed(current.load.get(k)) != typed(baseline.load.get(k))
    ]


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


def _refused(metric: str, point: str, limit: float, notes: list[str]) -> Check:
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
            checks += [_refused(lim.metric, point, lim.max_regression, notes) for lim in limits]
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


@dataclass(frozen=True, slots=True)
class Ratio:
    """`output_throughput[batching=continuous]/output_throughput[batching=static]>=2`: a
    ratio inside one sweep, at every value of its other axes; free of machine speed."""

    metric: str
    top: dict[str, str]  # axis -> value, as written
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

    def evaluate(self, results: Results, allow_invalid: bool = False) -> list[Check]:
        chosen = set(self.top) | set(self.bottom)
        unknown = chosen - set(results.axes)
        if unknown:
            raise GateInputError(f"ratio {self.text!r}: {sorted(unknown)} not axes of the sweep")
        rest = [a for a in results.axes if a not in chosen]
        groups: dict[tuple, dict[str, list[dict[str, Any]]]] = {}
        for row in results.rows:
            for side, sel in (("top", self.top), ("bottom", self.bottom)):
                if all(typed(row[k]) == typed(v) for k, v in sel.items()):
                    group = groups.setdefault(tuple(typed(row[a]) for a in rest), {})
                    group.setdefault(side, []).append(row)
        if not groups:
            raise GateInputError(f"ratio {self.text!r}: no point has both sides in {results.where}")
        checks = []
        for sides in groups.values():
            some = next(iter(sides.values()))[0]
            point = " ".join(f"{a}={some[a]}" for a in rest)
            top, bottom = (self._one(sides, side, point, results) for side in ("top", "bottom"))
            notes = [
                n
                for r in (top, bottom)
                if (n := untrusted(r, f"{results.where} {results.label(r)}", allow_invalid))
            ]
            if notes:
                checks.append(_refused(self.text, point, self.bound, notes))
                continue
            checks.append(self._check(top, bottom, point, results.where))
        return checks

    def _one(
        self, sides: dict[str, list[dict[str, Any]]], side: str, point: str, results: Results
    ) -> dict[str, Any]:
        """The single row one side selects at this point: none or several is unusable."""
        rows = sides.get(side, [])
        sel = ",".join(f"{k}={v}" for k, v in (self.top if side == "top" else self.bottom).items())
        at = f" at {point}" if point else ""
        if not rows:
            raise GateInputError(
                f"ratio {self.text!r}: no row of {results.where} matches [{sel}]{at}"
            )
        if len(rows) > 1:
            names = "; ".join(results.label(r) for r in rows)
            raise GateInputError(
                f"ratio {self.text!r}: [{sel}]{at} matches {len(rows)} rows ({names}); "
                "name more axes in the selector"
            )
        return rows[0]

    def _check(
        self, top_row: dict[str, Any], bottom_row: dict[str, Any], point: str, where: str
    ) -> Check:
        at = f"{where} {point}".strip()
        top = value_of(top_row, self.metric, at)
        bottom = value_of(bottom_row, self.metric, at)
        if top == 0 or bottom == 0:  # nothing measured on one side: no ratio to trust
            side = "denominator" if bottom == 0 else "numerator"
            note = f"{self.text}{' at ' + point if point else ''}: the {side} is 0"
            return Check(self.text, point, bottom, top, math.nan, self.bound, False, note=note)
        ratio = top / bottom
        ok = ratio >= self.bound if self.op == ">=" else ratio <= self.bound
        return Check(self.text, point, bottom, top, ratio, self.bound, ok)


def _selector(text: str, whole: str) -> dict[str, str]:
    out = {}
    for part in text.split(","):
        key, sep, value = part.partition("=")
        if not sep:
            raise GateInputError(f"ratio {whole!r}: {part!r} is not axis=value")
        out[key.strip()] = value.strip()
    return out
