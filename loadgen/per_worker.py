"""A run from several worker processes judged worker by worker as well as merged: one worker
falling behind (a busy core) hides in the merged p99 when its share is under 1% of the load,
so the run is INVALID when any worker's own p99 schedule lag is over the limit."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from loadgen.arrivals import ks_pvalue, ks_two_sample
from loadgen.metrics import distribution
from loadgen.records import RequestRecord


def worker_table(
    records: Sequence[RequestRecord], max_p99_lag_s: float, closed: bool = False
) -> list[dict[str, Any]]:
    """Per worker: requests, schedule lag, its share's scheduled and achieved rate and the
    two-sample KS test of its achieved gaps against its scheduled ones (a worker's share of a
    Poisson process is not Poisson: its own schedule is what it is judged against). A closed
    loop has no schedule: its achieved rate only."""
    measured = [r for r in records if not r.warmup and r.worker is not None]
    out = []
    for worker in sorted({r.worker for r in measured}):  # type: ignore[type-var]
        mine = [r for r in measured if r.worker == worker]
        lags = [lag for r in mine if (lag := r.schedule_lag_s) is not None]
        lag = distribution(lags)
        row: dict[str, Any] = {
            "worker": worker,
            "requests": len(mine),
            "completed": sum(r.ok for r in mine),
            "schedule_lag_s": lag,
            "valid": lag["p99"] is None or lag["p99"] <= max_p99_lag_s,
        }
        first_turns = [r for r in mine if not r.turn and r.send_s is not None]
        sent = sorted((r.index, r.scheduled_s, r.send_s - r.queue_s) for r in first_turns)  # type: ignore[operator]
        if len(sent) >= 3:
            scheduled = np.diff([s for _, s, _ in sent])
            achieved = np.diff([a for _, _, a in sent])
            span, sched_span = sent[-1][2] - sent[0][2], sent[-1][1] - sent[0][1]
            row["achieved_rate"] = (len(sent) - 1) / span if span > 0 else None
            if closed:  # each send was "scheduled" as it went: nothing to test
                out.append(row)
                continue
            row["scheduled_rate"] = (len(sent) - 1) / sched_span if sched_span > 0 else None
            d = ks_two_sample(achieved, scheduled)
            row["ks_vs_schedule"] = {"statistic": d, "p_value": ks_pvalue(d, len(achieved) / 2)}
        out.append(row)
    return out


def judge_workers(
    summary: dict[str, Any], records: Sequence[RequestRecord], closed: bool = False
) -> None:
    """Adds the per-worker table; a worker over the lag limit makes the run INVALID."""
    limit = summary["max_p99_lag_s"]
    table = worker_table(records, limit, closed)
    summary["workers"] = table
    late = [row for row in table if not row["valid"]]
    if late:
        summary["valid"] = False
    for row in late:
        summary["warnings"].append(
            f"worker {row['worker']} fell behind its schedule: p99 lag "
            f"{row['schedule_lag_s']['p99'] * 1e3:.1f} ms > {limit * 1e3:g} ms"
        )
