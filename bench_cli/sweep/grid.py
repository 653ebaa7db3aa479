"""A sweep profile's points: the product of its `[sweep]` axes, bundles spread out.

Kept apart from `bench_cli.sweep.runner` (which runs the points) so the report can rebuild a sweep's
points from sweep.json without importing the runner, and the runner can import the report."""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass
from typing import Any

from loadgen.profiles import load_profile

LOAD_AXES = ("rate", "concurrency")


@dataclass(frozen=True, slots=True)
class SweepPoint:
    index: int
    values: dict[str, Any]  # axis -> value (a bundle: its label)
    settings: dict[str, Any]  # what the point's runs get: the values, bundles spread out

    @property
    def label(self) -> str:
        return " ".join(f"{k}={v}" for k, v in self.values.items())

    @property
    def dirname(self) -> str:
        slug = "_".join(f"{k}-{v}" for k, v in self.values.items())
        return f"p{self.index:02d}-" + re.sub(r"[^A-Za-z0-9_.-]+", "", slug)[:80]


def load_sweep(
    profile: str | dict[str, Any], required: bool = True
) -> tuple[dict[str, Any], dict[str, list[Any]]]:
    """A profile's plain keys and its sweep axes (none, when not `required`: `--rates` gives
    the load of a profile without a [sweep] table). `profile`: a name, a path, or the keys
    themselves (`bench claims` builds its sweeps in code)."""
    data = dict(profile) if isinstance(profile, dict) else load_profile(profile)
    if isinstance(profile, dict):
        profile = str(data.get("name", "sweep"))
    axes = data.pop("sweep", None)
    if not axes and not required:
        return data, {}
    if not isinstance(axes, dict) or not axes:
        raise ValueError(f"profile {profile!r} has no [sweep] table of lists to sweep over")
    for key, values in axes.items():
        if not isinstance(values, list) or not values:
            raise ValueError(f"profile {profile!r}: sweep.{key} must be a non-empty list")
        if key in LOAD_AXES and any(isinstance(v, dict) for v in values):
            raise ValueError(f"profile {profile!r}: sweep.{key} is the load axis: numbers only")
    return data, axes


def grid(axes: dict[str, list[Any]]) -> list[SweepPoint]:
    """Every combination of the axes' values, the first axis varying slowest."""
    keys = list(axes)
    points = []
    for i, combo in enumerate(itertools.product(*(axes[k] for k in keys))):
        values, settings = {}, {}
        for key, value in zip(keys, combo, strict=True):
            if isinstance(value, dict):
                bundle = {k: v for k, v in value.items() if k != "label"}
                values[key] = value.get("label") or ",".join(f"{k}={v}" for k, v in bundle.items())
                settings |= bundle
            else:
                values[key] = settings[key] = value
        points.append(SweepPoint(i, values, settings))
    return points
