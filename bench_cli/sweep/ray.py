"""`bench sweep --ray-address ADDR|local`: the points (and their repeats) run at once as Ray
tasks, each asking for what it needs: a CPU for each of its load generator's processes, and a
GPU when it starts a server (--serve-cmd or the bundled engine) and the cluster has GPUs.

Each task runs the point as a serial sweep would (bench_cli/sweep_point.Sweep.run: its server
on a free port of its node, its run, --after-point-cmd) into a folder of its own on its node,
and sends the files back; the driver writes them into the point's folder, so the sweep folder
is the one a serial sweep writes (config.json names the driver's folder, not the task's). The
rows, sweep.csv, the table, the verdict and the report are the serial sweep's, in grid order.

Points against one --base-url send their loads at the same time: each point's summary warns
that its server served the others' too."""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import signal
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

from bench_cli.export import write_summary
from bench_cli.run.execute import exit_code
from bench_cli.run.interrupts import handling_signals
from bench_cli.sweep.grid import SweepPoint
from bench_cli.sweep.point import Sweep, finished
from bench_cli.sweep.row import aggregate

POLL_S = 0.5  # how often the driver looks up from waiting (a signal is handled then)
CANCEL_WAIT_S = 30.0  # cancelled tasks have this long to stop their servers


def check_ray_sweep(cfg: Any, rates_auto: bool, search: bool) -> None:
    """What cannot run as parallel tasks, refused before anything starts."""
    if rates_auto:
        raise ValueError(
            "--ray-address with --rates auto:N: the rates between come from the first two "
            "points' results, so they cannot run at once; give the rates (--rates 1,2,4)"
        )
    if search:
        raise ValueError(
            "--ray-address with --slo-search: each rate bisected depends on the last; "
            "sweep a list of rates instead"
        )
    for given, what in (
        (cfg.in_process, "--in-process (the bundled engine in the task's own process)"),
        (cfg.naive_batch is not None, "--naive-batch (transformers in the task's process)"),
        (cfg.ray_address, "a point's own --ray-address"),
        (cfg.workers == "auto", "--workers auto (it counts one machine's cores)"),
    ):
        if given:
            raise ValueError(
                f"--ray-address runs points at once on shared nodes: not with {what}; "
                "points start a server (--serve-cmd, or the bundled one) or load --base-url"
            )


def starts_server(cfg: Any, serve: Any) -> bool:
    """The point starts a server of its own: a --serve-cmd one, or the bundled engine's."""
    return serve is not None or (not cfg.base_url and cfg.engine_kind != "sim")


def resources(cfg: Any, serve: Any, cluster_gpus: float) -> dict[str, float]:
    """A task's Ray resources: one CPU per load-generating process, a GPU for its server."""
    gpus = 1 if starts_server(cfg, serve) and cluster_gpus >= 1 else 0
    return {"num_cpus": cfg.workers if isinstance(cfg.workers, int) else 1, "num_gpus": gpus}


@dataclass(slots=True)
class PointTask:
    sweep: Sweep  # the driver's, less its console
    point: SweepPoint
    k: int
    total: int
    cwd: str
    shared_server: str | None  # the --base-url every point loads at once, or None


@dataclass(slots=True)
class PointResult:
    files: dict[str, bytes]  # path in the point's folder -> content
    printed: str
    summary: dict[str, Any] | None
    code: int | None  # the exit code that ends the sweep, when the run could not run


def run_point(task: PointTask) -> PointResult:
    """The Ray task: one run of a point into a folder of this node's, then its files."""
    if os.path.isdir(task.cwd):  # relative paths in --serve-cmd mean what they did there
        os.chdir(task.cwd)
    buf = io.StringIO()
    stage = Path(tempfile.mkdtemp(prefix="bench-sweep-"))
    try:
        console = Console(file=buf, width=120)
        sweep = replace(task.sweep, console=console, dashboard=False, stage=stage)
        summary = sweep.run(task.point, task.k, task.total)
        code = summary if isinstance(summary, int) else None
        where = stage / _out(sweep, task.point, task.k).relative_to(sweep.sweep_dir)
        if isinstance(summary, dict) and task.shared_server and (where / "summary.json").exists():
            summary.setdefault("warnings", []).append(
                f"run at the same time as the sweep's other points (bench sweep --ray-address): "
                f"{task.shared_server} served their loads too"
            )
            write_summary(where, summary)
        files = {}
        if where.is_dir():
            for path in sorted(where.rglob("*")):
                if path.is_file():
                    files[str(path.relative_to(where))] = path.read_bytes()
        return PointResult(files, buf.getvalue(), summary if code is None else None, code)
    finally:
        shutil.rmtree(stage, ignore_errors=True)


def run_points(
    sweep: Sweep,
    points: list[SweepPoint],
    total: int,
    address: str,
    shared_server: str | None,
    config_of: Callable[[SweepPoint, Path], Any],
    on_row: Callable[[dict[int, dict[str, Any]]], None],
) -> dict[int, dict[str, Any]] | int:
    """Every run of every point as a Ray task (`config_of(point, out)`: its resolved config,
    for the resources it asks); each point's row (by index) once all its runs are back,
    the rows so far given to `on_row` as they come; or the exit code that ended the sweep."""
    from loadgen.ray_runner import connect

    console = sweep.console
    ray = connect(address)
    gpus = float(ray.cluster_resources().get("GPU", 0))
    remote = ray.remote(max_retries=0)(run_point)
    pending: dict[Any, tuple[SweepPoint, int]] = {}
    summaries: dict[int, dict[int, dict[str, Any]]] = {p.index: {} for p in points}
    rows: dict[int, dict[str, Any]] = {}
    task_sweep = replace(sweep, console=None)  # a Console does not pickle: the task makes its own
    for point in points:
        for k in range(sweep.repeat):
            out = _out(sweep, point, k)
            before = finished(out)
            if before is not None:
                title = escape(f"[{point.index + 1}/{total}] {point.label}")
                console.print(f"{title}: done before, kept", highlight=False)
                summaries[point.index][k] = before
                continue
            task = PointTask(task_sweep, point, k, total, os.getcwd(), shared_server)
            asks = resources(config_of(point, out), sweep.serve, gpus)
            pending[remote.options(**asks).remote(task)] = (point, k)
    console.print(
        f"{len(pending)} runs as Ray tasks on {address} "
        f"({ray.cluster_resources().get('CPU', 0):g} CPUs, {gpus:g} GPUs)",
        highlight=False,
    )
    for point in points:  # those done before
        if len(summaries[point.index]) == sweep.repeat:
            rows[point.index] = aggregate(point, _ordered(summaries[point.index]))
            on_row(rows)
    signals: list[int] = []
    with _noting_signals(signals):
        try:
            code = _gather(ray, pending, sweep, summaries, rows, on_row, signals)
        except BaseException:  # a bug of ours: stop the tasks before it propagates
            _cancel(ray, pending)
            raise
        if signals:
            _cancel(ray, pending)
    if signals:
        name = signal.Signals(signals[0]).name
        console.print(
            f"[yellow]interrupted[/] by {name}: finished points are kept (--resume)",
            highlight=False,
        )
        return 128 + signals[0]
    return rows if code is None else code


def _gather(
    ray: Any,
    pending: dict[Any, tuple[SweepPoint, int]],
    sweep: Sweep,
    summaries: dict[int, dict[int, dict[str, Any]]],
    rows: dict[int, dict[str, Any]],
    on_row: Callable[[dict[int, dict[str, Any]]], None],
    signals: list[int],
) -> int | None:
    """Each run's files and summary as its task ends, until all have or a signal came; the
    exit code when a run could not run (the other tasks cancelled)."""
    console = sweep.console
    while pending and not signals:
        ready, _ = ray.wait(list(pending), num_returns=1, timeout=POLL_S)
        for ref in ready:
            point, k = pending.pop(ref)
            try:
                result: PointResult = ray.get(ref)
            except Exception as e:  # the task raised, or its worker died
                _cancel(ray, pending)
                console.print(
                    f"[bold red]error at {escape(point.label)}:[/] {escape(str(e))}",
                    highlight=False,
                )
                return 1
            _write(_out(sweep, point, k), result.files)
            console.print(result.printed.rstrip(), markup=False, highlight=False)
            if result.code is not None:
                _cancel(ray, pending)
                return result.code
            assert result.summary is not None
            if result.summary["interrupted"]:
                _cancel(ray, pending)
                console.print("[yellow]interrupted[/]: finished points are kept (--resume)")
                return exit_code(result.summary)
            summaries[point.index][k] = result.summary
            if len(summaries[point.index]) == sweep.repeat:
                rows[point.index] = aggregate(point, _ordered(summaries[point.index]))
                on_row(rows)
    return None


def _noting_signals(into: list[int]) -> contextlib.AbstractContextManager[None]:
    """Ctrl-C and SIGTERM noted, not raised, while the driver waits on Ray: an exception
    raised from a handler inside Ray's wait leaves it a SystemError, and the tasks running."""
    return handling_signals(lambda signum, frame: into.append(signum))


def _out(sweep: Sweep, point: SweepPoint, k: int) -> Path:
    return sweep.sweep_dir / point.dirname / (f"run{k + 1}" if sweep.repeat > 1 else "")


def _ordered(by_run: dict[int, dict[str, Any]]) -> list[dict[str, Any]]:
    return [by_run[k] for k in sorted(by_run)]


def _write(out: Path, files: dict[str, bytes]) -> None:
    """A run's files, in the driver's sweep folder (an unfinished attempt's replaced)."""
    shutil.rmtree(out, ignore_errors=True)
    for name, data in files.items():
        path = out / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)


def _cancel(ray: Any, pending: dict[Any, Any]) -> None:
    """Cancel the tasks still running (each stops its server on the way out), and give them
    a moment to, so no server outlives the sweep on this machine."""
    for ref in pending:
        ray.cancel(ref)
    if pending:
        ray.wait(list(pending), num_returns=len(pending), timeout=CANCEL_WAIT_S)
