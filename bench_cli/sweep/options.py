"""`SweepOptions`: what `bench sweep` is asked beside its profile and the runs' flags (how
many runs a point, where to resume, how the loads are found, where the points run), carried
as one value from the command (or a claim) to the sweep (runner.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from bench_cli.sweep.serve_cmd import ServeCommand


@dataclass(frozen=True, slots=True)
class SweepOptions:
    repeat: int = 1  # runs a point (--repeat)
    resume: str | None = None  # a sweep folder whose finished points are kept (--resume)
    dashboard: bool = False  # the live view of each run (the command's default: on)
    rates: str | None = None  # --rates: the load axis, a list or auto:N
    serve: ServeCommand | None = None  # --serve-cmd: a server started for every run
    search: str | None = None  # --slo-search LO:HI[:STEPS]
    target: float | None = None  # --slo-target: the share of requests in SLO that serves
    ray_address: str | None = None  # --ray-address: the points at once as Ray tasks
