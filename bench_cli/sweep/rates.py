"""`bench sweep --rates`: the load axis given on the command line, as a list or found
automatically as guidellm's sweep profile finds it.

`--rates 1,2,4` replaces the profile's `rate` axis. `--rates auto:N` runs N loads: a
synchronous point (a closed loop at concurrency 1: what one request at a time achieves), a
throughput point (every request sent at once, rate inf: what the server achieves flat out),
and N-2 open-loop rates spaced linearly between the two achieved request rates, as guidellm
spaces them (`linspace(sync, throughput, N-1)[1:]`: the last rate is the throughput point's
own rate, sent as a steady stream, which asks whether the server can hold its peak).

The anchors are measured once, at the first combination of the other axes' settings, and
stored in sweep.json, so a resumed sweep runs the rates it started with."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from bench_cli.sweep.grid import SweepPoint, grid

SYNC = "sync"  # the synchronous point's value on the rate axis (it has no rate)
# The synchronous point as a bundle: grid() names it by its label and gives its runs the rest.
SYNC_POINT = {"label": SYNC, "concurrency": 1}


@dataclass(frozen=True, slots=True)
class RateSpec:
    """What `--rates` asked for: N automatic loads, or a list of rates."""

    text: str
    auto: int | None = None
    rates: tuple[float, ...] = ()

    @classmethod
    def parse(cls, text: str) -> RateSpec:
        text = text.strip()
        if text.startswith("auto"):
            _, sep, n = text.partition(":")
            if not sep or not n.strip().isdigit() or int(n) < 3:
                raise ValueError(
                    f"--rates {text!r}: expected auto:N with N >= 3 (a synchronous point, a "
                    "throughput point and N-2 rates between them)"
                )
            return cls(text, auto=int(n))
        try:
            rates = tuple(float(r) for r in text.split(","))
        except ValueError:
            raise ValueError(f"--rates {text!r}: expected auto:N or rates such as 1,2,4") from None
        if not all(r > 0 for r in rates):  # NaN fails this too
            raise ValueError(f"--rates {text!r}: every rate must be > 0 requests/s (or inf)")
        return cls(text, rates=rates)


def apply(spec: RateSpec, axes: dict[str, list[Any]]) -> dict[str, list[Any]]:
    """The axes with `--rates` as their load. A list replaces the profile's rate axis in place
    (or comes last); auto leaves the rate axis out until the anchors are known."""
    if spec.auto is None:
        return axes | {"rate": list(spec.rates)}
    if "concurrency" in axes:
        raise ValueError(
            "--rates auto picks the loads itself: the profile's sweep.concurrency cannot go "
            "with it (give a list of rates, or drop the concurrency axis)"
        )
    return {k: v for k, v in axes.items() if k != "rate"}


def between(synchronous: float, throughput: float, n: int) -> list[float]:
    """guidellm's N-2 rates: linear from the synchronous rate (left out: it was run) to the
    throughput rate, rounded to 4 significant digits so labels and folders stay readable."""
    return [float(f"{r:.4g}") for r in np.linspace(synchronous, throughput, n - 1)[1:]]


def auto_axes(settings: dict[str, list[Any]], rates: list[float]) -> dict[str, list[Any]]:
    """The setting axes, then the load last (so each setting's loads run together, lightest
    first): the synchronous point, the rates between, the throughput point."""
    return settings | {"rate": [dict(SYNC_POINT), *rates, math.inf]}


def anchor_points(settings: dict[str, list[Any]], n: int) -> tuple[SweepPoint, SweepPoint]:
    """The first setting's synchronous and throughput points: their folders do not depend on
    the rates still unknown, so the anchor runs are the sweep's own points, not extra runs."""
    points = grid(auto_axes(settings, [1.0] * (n - 2)))  # placeholder rates
    return points[0], points[n - 1]


def anchors_record(
    spec: RateSpec,
    arrival: str,
    points: tuple[SweepPoint, SweepPoint],
    achieved: tuple[float, float],
) -> dict[str, Any]:
    """What sweep.json keeps of how the rates were found."""
    sync, thr = points
    assert spec.auto is not None
    settings = {k: v for k, v in sync.values.items() if k != "rate"}
    return {
        "rates": spec.text,
        "arrival": arrival,
        "measured_with": settings,
        "synchronous": {"point": sync.dirname, "concurrency": 1, "request_throughput": achieved[0]},
        "throughput": {"point": thr.dirname, "rate": math.inf, "request_throughput": achieved[1]},
        "between": between(*achieved, spec.auto),
        "spacing": "linspace(synchronous, throughput, N-1)[1:], as guidellm's sweep",
    }


def check_load_flags(
    flags: dict[str, Any], axes: dict[str, list[Any]], spec: RateSpec | None
) -> None:
    """`--num-requests`, `--duration` and `--rate` replace the profile's load at every point;
    one that names an axis would be overridden by it at each point, so it is refused."""
    swept = set(axes) | ({"rate"} if spec is not None and spec.auto else set())
    for key in ("num_requests", "duration", "rate"):
        if flags.get(key) is not None and key in swept:
            flag = "--" + key.replace("_", "-")
            hint = " (--rates replaces the rate axis)" if key == "rate" else ""
            raise ValueError(f"{flag}: the sweep has a {key} axis already{hint}")
