"""What a claim's sweep left on disk, read back: each point's summary, resolved engine config and
engine step log, and the step-log statistics the verdicts rest on.

Step-log figures are weighted by each step's duration, so a long prefill step counts for the
time it held the batch, not as one sample among many short decode steps."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench_cli.sweep.grid import SweepPoint, grid


@dataclass(slots=True)
class Point:
    """One finished sweep point: its label, settings and what its run wrote."""

    point: SweepPoint
    dir: Path
    summary: dict[str, Any]
    engine: dict[str, Any] = field(default_factory=dict)  # config.json's resolved engine
    steps: list[dict[str, Any]] = field(default_factory=list)  # steps.jsonl, one line a step

    @property
    def label(self) -> str:
        return self.point.label

    def value(self, axis: str) -> Any:
        return self.point.values.get(axis)

    def klass(self, name: str) -> dict[str, Any]:
        """A traffic class's summary (a mix's per-class figures)."""
        return (self.summary.get("classes") or {})[name]


def read_sweep(sweep_dir: Path) -> list[Point]:
    """The sweep's points that finished, in grid order (a point without summary.json is left
    out: the caller decides whether that leaves enough to judge)."""
    plan = json.loads((sweep_dir / "sweep.json").read_text())
    points = []
    for p in grid(plan["axes"]):
        run = sweep_dir / p.dirname
        try:
            summary = json.loads((run / "summary.json").read_text())
        except (OSError, ValueError):
            continue
        config = _json(run / "config.json")
        points.append(Point(p, run, summary, config.get("engine") or {}, read_steps(run)))
    return points


def read_steps(run: Path) -> list[dict[str, Any]]:
    try:
        lines = (run / "steps.jsonl").read_text().splitlines()
    except OSError:
        return []
    return [json.loads(line) for line in lines if line.strip()]


def _json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def time_mean(steps: list[dict[str, Any]], key: str) -> float | None:
    """`key`'s mean over the run's busy time (each step weighted by its duration)."""
    busy = sum(s["dur_s"] for s in steps if key in s)
    if not busy:
        return None
    return sum(s[key] * s["dur_s"] for s in steps if key in s) / busy


def peak(steps: list[dict[str, Any]], key: str) -> float | None:
    values = [s[key] for s in steps if key in s]
    return max(values) if values else None


def kv_waste(steps: list[dict[str, Any]], block_size: int) -> float | None:
    """The share of reserved KV memory (blocks in use x block size) that held no token,
    over the run's busy time: what a contiguous max-length reservation throws away."""
    reserved = sum(s["kv_blocks_used"] * block_size * s["dur_s"] for s in steps if "kv_tokens" in s)
    if not reserved:
        return None
    held = sum(s["kv_tokens"] * s["dur_s"] for s in steps if "kv_tokens" in s)
    return 1.0 - held / reserved


def queue_delays(steps: list[dict[str, Any]]) -> list[float]:
    """Every request's wait from arrival in the engine to its first scheduled step."""
    return [q for s in steps for q in s.get("queue_s", ())]


def mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None
