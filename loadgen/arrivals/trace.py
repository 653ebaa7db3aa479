"""Trace arrivals: a recorded trace's own timestamps (loadgen/traces.py reads the file, which
also gives each request's lengths), replayed with the gaps scaled by --time-scale."""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loadgen.arrivals.base import ArrivalProcess, param, register
from loadgen.traces import TRACE_FORMATS


@register
@dataclass(frozen=True, slots=True)
class Trace(ArrivalProcess):
    name = "trace"
    description = "a trace file's own timestamps (--trace FILE, --time-scale)"
    in_classes = False  # a trace gives one schedule (and the lengths) for the whole run
    run_keys = ("trace", "trace_format", "trace_model")
    replays = True
    trace_offsets: tuple[float, ...] = ()  # seconds since the trace's first request
    time_scale: float = param(1.0, "multiplies trace gaps (0.5: twice as fast)")

    def check(self) -> None:
        if not self.trace_offsets:
            raise ValueError("trace arrivals need the trace's timestamps")
        if not (self.time_scale > 0 and math.isfinite(self.time_scale)):
            raise ValueError(f"time scale must be > 0, got {self.time_scale}")

    def offsets(self, seed: int) -> Iterator[float]:
        return (t * self.time_scale for t in self.trace_offsets)

    @classmethod
    def describe(cls, settings: Mapping[str, Any], per_s: str = "req/s") -> str:
        return f"trace {Path(settings.get('trace') or '').name} x{settings['time_scale']:g}"

    @classmethod
    def check_run(cls, run: Any) -> None:
        if not run.trace:
            raise ValueError("--arrival trace needs --trace FILE")
        if run.trace_format not in TRACE_FORMATS:
            known = ", ".join(TRACE_FORMATS)
            raise ValueError(f"trace format {run.trace_format!r}: expected one of {known}")
        if run.rate is not None:
            raise ValueError("a trace sets its own times: use --time-scale, not --rate")
        if run.input_len is not None:
            raise ValueError("a trace gives the prompt lengths: --input-len cannot go with it")

    @classmethod
    def refuse(cls, key: str, arrival: str) -> str:
        if key == "trace":
            return f"--trace is replayed by --arrival trace, not {arrival}"
        return f"--{key.replace('_', '-')} shapes trace arrivals; {arrival} has none"

    @classmethod
    def check_params(cls, params: Mapping[str, Any]) -> None:
        own = {p.name: params[p.name] for p in cls.params() if params.get(p.name) is not None}
        cls(trace_offsets=(0.0,), **own)  # the rows are read later: any will do for the check

    @classmethod
    def build(cls, rate: float | None, params: Mapping[str, Any]) -> ArrivalProcess:
        raise ValueError("trace arrivals are built from the trace's rows (loadgen/benchmark.py)")
