"""`bench sweep --slo-search LO:HI[:STEPS]`: for each setting, the highest request rate whose
SLO attainment stays at the target (--slo-target, 90 % by default) or more (the knee of
bench_cli.sweep.table), found by bisection on the rate instead of a fixed grid of rates: HI
first (served: the knee lies beyond it), then LO (not served: none), then STEPS midpoints.
Every run is an ordinary sweep point in sweep.csv. Bisection assumes the share in SLO falls as
the rate rises: where the runs show it rising beyond noise, the answer is marked DOUBTFUL."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console

from bench_cli.export import write_json
from bench_cli.sweep.grid import SweepPoint, grid
from bench_cli.sweep.table import SLO_ATTAINMENT, attainment_rise


@dataclass(frozen=True, slots=True)
class SearchSpec:
    low: float
    high: float
    steps: int = 5

    @classmethod
    def parse(cls, text: str) -> SearchSpec:
        parts = text.split(":")
        try:
            if len(parts) not in (2, 3):
                raise ValueError
            low, high = float(parts[0]), float(parts[1])
            steps = int(parts[2]) if len(parts) == 3 else 5
        except ValueError:
            raise ValueError(f"--slo-search {text!r}: give LO:HI or LO:HI:STEPS (rates)") from None
        if not 0 < low < high or high == float("inf"):
            raise ValueError(f"--slo-search {text!r}: need 0 < LO < HI, both finite")
        if not 1 <= steps <= 20:
            raise ValueError(f"--slo-search {text!r}: STEPS must be 1..20")
        return cls(low, high, steps)


@dataclass(slots=True)
class SearchResult:
    served: float | None  # the highest rate tested that met the target
    failed: float | None  # the lowest rate tested above it that did not
    tested: list[tuple[float, float | None]] = field(default_factory=list)  # (rate, attainment)
    doubt: str | None = None  # the share in SLO rose with the rate: bisection's premise broke

    def text(self, target: float = SLO_ATTAINMENT) -> str:
        doubt = f" (DOUBTFUL: {self.doubt})" if self.doubt else ""
        if self.served is None:
            return f"none: {self.failed:g} req/s already below {target:.0%} in SLO{doubt}"
        if self.failed is None:
            return f"not reached up to {self.served:g} req/s{doubt}"
        return f"{self.served:g} req/s ({self.failed:g} req/s was not){doubt}"


def bisect(
    attainment_at: Callable[[float], float | None], spec: SearchSpec, target: float = SLO_ATTAINMENT
) -> SearchResult:
    """At most STEPS + 2 runs. A run with no attainment (nothing completed) counts as a miss.
    Assumes attainment falls as the rate rises, as it does below saturation; a run that breaks
    this shows in `tested`."""
    result = SearchResult(None, None)

    def ok(rate: float) -> bool:
        value = attainment_at(rate)
        result.tested.append((rate, value))
        return value is not None and value >= target

    if ok(spec.high):
        result.served = spec.high
        return result
    result.failed = spec.high
    if not ok(spec.low):
        result.failed = spec.low
        return result
    low, high = spec.low, spec.high
    for _ in range(spec.steps):
        mid = float(f"{(low + high) / 2:.4g}")  # rates a reader can type again
        if not low < mid < high:
            break
        if ok(mid):
            low = mid
        else:
            high = mid
    result.served, result.failed = low, high
    return result


def search_record(
    results: dict[str, SearchResult], spec: SearchSpec, target: float = SLO_ATTAINMENT
) -> dict[str, Any]:
    return {
        "low": spec.low,
        "high": spec.high,
        "steps": spec.steps,
        "target": target,
        "settings": {
            name: {"served": r.served, "failed": r.failed, "tested": r.tested, "doubt": r.doubt}
            for name, r in results.items()
        },
    }


def run_search(
    point_row: Callable[[SweepPoint, int], dict[str, Any] | int],
    spec: SearchSpec,
    axes: dict[str, list[Any]],
    rows: list[dict[str, Any]],
    save: Callable[[], None],
    console: Console,
    sweep_dir: Path,
    target: float = SLO_ATTAINMENT,
) -> int | None:
    """Bisect each setting's rate, `point_row` running each point (bench_cli.sweep.point's
    Sweep.point_row), appending its row and saving sweep.csv after each; an exit code when a
    point could not finish."""
    settings = grid(axes) if axes else [SweepPoint(0, {}, {})]
    total = len(settings) * (spec.steps + 2)  # at most
    results: dict[str, SearchResult] = {}
    stop: list[int] = []

    class Stopped(Exception):
        pass

    def attainment_at(setting: SweepPoint, rate: float, ran: list[dict[str, Any]]) -> float | None:
        values, settings = setting.values | {"rate": rate}, setting.settings | {"rate": rate}
        row = point_row(SweepPoint(len(rows), values, settings), total)
        if isinstance(row, int):
            stop.append(row)
            raise Stopped
        rows.append(row)
        ran.append(row)
        save()
        return row.get("slo_attainment")

    for setting in settings:
        name, ran = setting.label or "all", []
        try:
            found = bisect(lambda r, s=setting, ran=ran: attainment_at(s, r, ran), spec, target)
        except Stopped:
            return stop[0]
        found.doubt = attainment_rise(ran, "rate")
        results[name] = found
        console.print(
            f"{name}: highest rate with {target:.0%} in SLO: {found.text(target)}",
            highlight=False,
        )
    write_json(sweep_dir / "slo_search.json", search_record(results, spec, target))
    return None
