"""`Sweep.summaries`: a point's repeats run one after another, and the first that cannot run
or is interrupted ends the point (and the sweep) with its exit code. Runs are scripted here:
what is checked is the loop that point_row and the auto-rate anchors share."""

import io
import signal
from pathlib import Path
from typing import Any

from rich.console import Console

from bench_cli.sweep.grid import SweepPoint
from bench_cli.sweep.point import Sweep

POINT = SweepPoint(0, {"rate": 4}, {"rate": 4})


def scripted(results: list[dict[str, Any] | int], repeat: int) -> tuple[Sweep, list[int]]:
    """A sweep whose run k returns results[k] (and records that it ran)."""
    ran: list[int] = []

    class Scripted(Sweep):
        __slots__ = ()

        def run(self, point: SweepPoint, k: int, total: int) -> dict[str, Any] | int:
            ran.append(k)
            return results[k]

    console = Console(file=io.StringIO(), width=120)
    return Scripted({}, {}, Path("unused"), "s", repeat, False, console), ran


def summary(throughput: float, **kw: Any) -> dict[str, Any]:
    return {"interrupted": False, "request_throughput": throughput} | kw


def test_every_repeat_runs_in_turn_and_their_summaries_come_back_in_order() -> None:
    runs = [summary(1.0), summary(2.0), summary(3.0)]
    sweep, ran = scripted(runs, repeat=3)
    assert sweep.summaries(POINT, 1) == runs
    assert ran == [0, 1, 2]


def test_a_run_that_could_not_run_ends_the_point_with_its_exit_code() -> None:
    sweep, ran = scripted([summary(1.0), 2, summary(3.0)], repeat=3)
    assert sweep.summaries(POINT, 1) == 2
    assert ran == [0, 1]  # the third repeat never starts


def test_an_interrupted_run_ends_the_point_with_the_signals_exit_code() -> None:
    stopped = summary(1.0, interrupted=True, stop_signal=signal.SIGTERM)
    sweep, ran = scripted([stopped, summary(2.0)], repeat=2)
    assert sweep.summaries(POINT, 1) == 128 + signal.SIGTERM
    assert ran == [0]
    assert "interrupted" in sweep.console.file.getvalue()  # type: ignore[attr-defined]


def test_point_row_aggregates_the_summaries_or_passes_the_exit_code_on() -> None:
    sweep, _ = scripted([3], repeat=1)
    assert sweep.point_row(POINT, 1) == 3
