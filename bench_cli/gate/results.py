"""What `bench gate` judges: a run's summary or a sweep's rows, metrics under their dotted
names, and the load they were measured under (two runs given different loads differ for
reasons other than the server)."""

from __future__ import annotations

import json
import math
import numbers
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bench_cli.sweep.grid import grid
from loadgen.arrivals import arrival_keys
from loadgen.config import RunConfig


class GateInputError(ValueError):
    """Unusable input: a missing file or a metric that does not exist (exit code 2)."""


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
