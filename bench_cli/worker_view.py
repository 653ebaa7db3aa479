"""The per-worker table of a run from several worker processes (--workers, --ray-address),
in the terminal and in report.html alike: a late worker hides in the merged figures, so each
worker's lag, rates and arrival test are shown, and the late one is named in its row."""

from __future__ import annotations

import html
from typing import Any

from rich.table import Table

COLUMNS = (
    "worker",
    "sent",
    "ok",
    "lag p50 (ms)",
    "lag p99 (ms)",
    "scheduled req/s",
    "achieved req/s",
    "KS p vs schedule",
    "kept to schedule",
)


def worker_rows(summary: dict[str, Any]) -> list[list[str]]:
    """Each worker's cells, as text: the same words in both places."""
    limit = summary.get("max_p99_lag_s")
    rows = []
    for w in summary.get("workers") or []:
        lag = w.get("schedule_lag_s") or {}
        ks = w.get("ks_vs_schedule") or {}
        verdict = "yes"
        if not w["valid"]:
            verdict = "NO: LATE" + (f" (p99 > {limit * 1e3:g} ms)" if limit is not None else "")
        rows.append(
            [
                str(w["worker"]),
                str(w["requests"]),
                str(w["completed"]),
                _ms(lag.get("p50")),
                _ms(lag.get("p99")),
                _rate(w.get("scheduled_rate")),
                _rate(w.get("achieved_rate")),
                "-" if ks.get("p_value") is None else f"{ks['p_value']:.2f}",
                verdict,
            ]
        )
    return rows


def _title(summary: dict[str, Any]) -> str:
    offsets = summary.get("clock_offsets")
    title = f"Per worker ({len(summary.get('workers') or [])} processes)"
    return title + (" on Ray" if offsets else "")


def clock_text(summary: dict[str, Any]) -> str:
    """Ray workers: where each ran and its clock's offset to the driver's, with the
    uncertainty of that measurement (the timelines place its events with it)."""
    parts = [
        f"worker {c['worker']} on {c['node']} (pid {c['pid']}): clock offset "
        f"{c['offset_s'] * 1e3:+.3f} ms +- {c['uncertainty_s'] * 1e3:.3f} ms"
        for c in summary.get("clock_offsets") or []
    ]
    return "; ".join(parts)


def worker_table(summary: dict[str, Any]) -> Table | None:
    rows = worker_rows(summary)
    if not rows:
        return None
    caption = clock_text(summary) or None
    table = Table(title=_title(summary), title_justify="left", caption=caption)
    for col in COLUMNS:
        table.add_column(col, justify="right", no_wrap=col != "kept to schedule")
    for cells in rows:
        late = cells[-1] != "yes"
        table.add_row(*cells, style="bold red" if late else None)
    return table


def worker_table_html(summary: dict[str, Any]) -> str:
    rows = worker_rows(summary)
    if not rows:
        return ""
    head = "".join(f"<th>{html.escape(c)}</th>" for c in COLUMNS)
    body = ""
    for cells in rows:
        style = " style='background:#f8d7da;font-weight:bold'" if cells[-1] != "yes" else ""
        body += f"<tr{style}>" + "".join(f"<td>{html.escape(c)}</td>" for c in cells) + "</tr>"
    clock = clock_text(summary)
    clock = f"<p>{html.escape(clock)}</p>" if clock else ""
    return f"<h3>{html.escape(_title(summary))}</h3><table><tr>{head}</tr>{body}</table>{clock}"


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:z.2f}"


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"
