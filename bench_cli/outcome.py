"""What a reader must know about a run before any of its numbers: it was interrupted (and
in which phase), stopped itself, measured nothing, or did not offer the load asked for. The
terminal and report.html say it in the same words."""

from __future__ import annotations

import signal
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Notice:
    severity: str  # "error" (the numbers are not what was asked for) or "note"
    label: str  # "NOTHING MEASURED", "INVALID RUN", "interrupted", "stopped early"
    text: str


def notices(summary: dict[str, Any]) -> list[Notice]:
    out = []
    if summary.get("interrupted"):
        number = summary.get("stop_signal") or signal.SIGINT
        try:
            name = signal.Signals(number).name
        except ValueError:
            name = f"signal {number}"
        phase = summary.get("stopped_in")
        during = f" during the {phase}" if phase else ""
        out.append(
            Notice(
                "note",
                "interrupted",
                f"by {name}{during}: the summary covers the requests that finished",
            )
        )
    if summary.get("worker_failure"):
        out.append(Notice("error", "WORKER FAILED", summary["worker_failure"]))
    if summary.get("stopped_early"):
        out.append(Notice("error", "stopped early", summary["stopped_early"]))
    if summary.get("completed") == 0:
        counts = f"{summary.get('failed', 0)} failed, {summary.get('cancelled', 0)} cancelled"
        reasons = summary.get("failure_reasons") or {}
        why = "; ".join(f"{n} x {reason}" for reason, n in list(reasons.items())[:3])
        out.append(
            Notice(
                "error",
                "NOTHING MEASURED",
                f"no request succeeded, nothing was measured ({counts})"
                + (f": {why}" if why else ""),
            )
        )
    elif not summary.get("valid", True):
        lag = (summary.get("schedule_lag_s") or {}).get("p99")
        limit = summary.get("max_p99_lag_s")
        detail = ""
        late = [w for w in summary.get("workers") or [] if not w["valid"]]
        # --workers: each late worker by name, whether or not the merged p99 is over too
        named = ", ".join(
            f"worker {w['worker']}'s {w['schedule_lag_s']['p99'] * 1e3:.1f} ms" for w in late
        )
        if lag is not None and limit is not None and lag > limit:
            detail = f" (p99 schedule lag {lag * 1e3:.1f} ms > {limit * 1e3:g} ms"
            detail += f"; late: {named})" if late else ")"
        elif late and limit is not None:
            detail = f" (p99 schedule lag over {limit * 1e3:g} ms: {named})"
        out.append(
            Notice(
                "error",
                "INVALID RUN",
                f"the load generator could not keep to its schedule{detail}: the load offered "
                "was not the load asked for",
            )
        )
    return out
