"""The live panel fits a 100x30 pane (issue 45): a telemetry row that stayed zero for the
whole run (speculation on a run without it, preemptions that never came) is left out."""

from __future__ import annotations

import io
import time
from types import SimpleNamespace
from typing import Any

from rich.console import Console

from bench_cli.dashboard import Dashboard
from loadgen.runner import Progress

ZERO_ALL_RUN = ("engine_waiting", "engine_preemptions", "engine_spec_drafts",
                "engine_spec_draft_tokens", "engine_spec_accepted_tokens",
                "engine_spec_lookups", "engine_spec_proposals")  # fmt: skip


def _rows(n: int = 40) -> list[dict[str, Any]]:
    """A bundled engine's telemetry without speculation: its spec counters stay at 0."""
    rows = []
    for i in range(n):
        row = {"t": 0.5 * i, "server_cpu_percent": 150.0, "server_rss_mb": 3000.0 + i}
        row |= {"engine_running": 3.0, "engine_kv_blocks_used": 10.0 + i}
        row |= {"engine_kv_peak_blocks_used": 40.0, "engine_prefix_cache_queries": 16.0 * i}
        row |= {"engine_prefix_cache_hits": 0.0 if i < 30 else 8.0}  # late, but not zero
        row |= dict.fromkeys(ZERO_ALL_RUN, 0.0)
        row |= {"machine_cpu_percent": 190.0, "machine_steal_percent": 10.0 if i == 3 else 0.0}
        rows.append(row)
    return rows


def _screen(rows: list[dict[str, Any]], cpus: int = 2) -> str:
    runner = SimpleNamespace(
        progress=Progress(total=100, sent=60, completed=50),
        t0=time.perf_counter() - 10,
        records=[],
        plan=SimpleNamespace(duration_s=None, offsets=None),
        next_send=None,
    )
    buf = io.StringIO()
    console = Console(file=buf, width=100, force_terminal=False)
    telemetry = SimpleNamespace(rows=rows, machine_cpus=cpus)
    console.print(Dashboard(runner, telemetry, "t", 4.0, console).render())
    return buf.getvalue()


def test_rows_zero_for_the_whole_run_are_hidden_and_the_panel_fits_100x30() -> None:
    screen = _screen(_rows())
    assert "waiting" not in screen and "draft" not in screen and "preempted" not in screen
    assert "running" in screen and "KV" in screen, screen
    assert "hits" in screen, screen  # zero at first, then not: shown
    assert "machine CPU " in screen and "stolen" not in screen  # one stolen tick: no row
    lines = screen.rstrip("\n").splitlines()
    assert len(lines) <= 30 and max(len(line) for line in lines) <= 100, screen


def test_the_hypervisors_steal_is_shown_once_the_run_will_warn_of_it() -> None:
    rows = _rows()
    for row in rows[10:]:
        row["machine_steal_percent"] = 20.0  # 10 % of a 2-core machine's time, mean 8.8 %
    screen = _screen(rows)
    assert "machine CPU stolen" in screen, screen
    assert "stolen" not in _screen(rows, cpus=16)  # the same time is 0.5 % of 16 cores


def test_a_row_once_nonzero_stays_after_its_rows_scroll_away() -> None:
    rows = _rows(200)
    runner_rows = SimpleNamespace(rows=rows[:100])
    runner = SimpleNamespace(
        progress=Progress(total=10), t0=time.perf_counter() - 1, records=[],
        plan=SimpleNamespace(duration_s=None, offsets=None), next_send=None,
    )  # fmt: skip
    for row in rows[:100]:
        row["engine_waiting"] = 2.0 if row["t"] < 1 else 0.0  # a queue at the start only
    console = Console(file=io.StringIO(), width=100)
    view = Dashboard(runner, runner_rows, "t", None, console)
    view.render()
    runner_rows.rows = rows  # later: the first rows are beyond the sparkline's window
    buf = io.StringIO()
    Console(file=buf, width=100).print(view.render())
    assert "waiting" in buf.getvalue()
