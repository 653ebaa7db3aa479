"""`bench sweep`: one load list against a grid of settings, a fresh server per point.

A sweep profile is a `bench run` profile plus a `[sweep]` table of lists; the points are
their product, in the table's order:

    [sweep]
    batching = ["static", "continuous"]   # any engine setting or run key
    rate = [0.5, 1, 2]                    # the load axis: rate or concurrency

An axis may also list inline tables, each a bundle of settings that go together (and an
optional `label` naming it in tables and plots): points a product cannot express, such as
chunk sizes next to no chunking at all:

    prefill = [{max_num_batched_tokens = 256}, {label = "off", enable_chunked_prefill = false}]

Each point (and each of its `--repeat` runs) writes an ordinary run folder; `sweep.csv` holds
one row a point, rewritten after every point, so an interrupted sweep keeps what finished
and `--resume DIR` skips it. `--rates` gives the load axis on the command line, as a list or
found automatically (`auto:N`, guidellm's sweep: see bench_cli.sweep_rates)."""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import shlex
import shutil
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.markup import escape

from bench_cli.export import run_dir, write_json
from bench_cli.interrupts import Interrupted, raising_on_signals
from bench_cli.local_server import ServerProcess, ServerStartError
from bench_cli.run_command import INVALID_EXIT, exit_code, resolve_config, run_one
from bench_cli.serve_cmd import ServeCommand
from bench_cli.sweep_grid import LOAD_AXES, SweepPoint, grid, load_sweep
from bench_cli.sweep_rates import (
    RateSpec,
    anchor_points,
    anchors_record,
    apply,
    auto_axes,
    check_load_flags,
)
from bench_cli.sweep_table import invalid, print_comparison
from bench_cli.sweep_verdict import print_verdict
from bench_cli.sweep_verdict import slo_target_of as target_of
from bench_cli.vllm_json import check_vllm_json_path
from loadgen.config import RunConfig
from loadgen.redact import redact_settings

# What sweep.csv keeps of each run's summary (and aggregates over repeats): a selection of
# loadgen.metrics.DISTRIBUTIONS and STATS, so the CSV stays readable.
KEPT_DISTRIBUTIONS = ("ttft_s", "itl_s", "tpot_s", "e2e_s", "ttft_with_queue_s", "schedule_lag_s")
KEPT_STATS = ("mean", "p50", "p90", "p99")
SCALARS = (
    "request_throughput",
    "output_throughput",
    "total_token_throughput",
    "goodput",
    "completed",
    "failed",
    "duration_s",
)
CLASS_DISTRIBUTIONS = ("ttft_s", "itl_s", "tpot_s", "e2e_s")
CLASS_SCALARS = ("request_throughput", "output_throughput", "goodput", "completed", "failed")
# The keys a grid may set for the load rather than the server (--serve-cmd): rate, ...
RUN_KEYS = {f.name for f in dataclasses.fields(RunConfig)} - {"engine", "classes"}
# Student's t at 97.5 % for 1..30 degrees of freedom: 95 % two-sided confidence intervals.
T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179)
T975 += (2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064)
T975 += (2.060, 2.056, 2.052, 2.048, 2.045, 2.042)


def t975(df: int) -> float:
    return T975[df - 1] if df <= len(T975) else 1.96 + 2.4 / df


def metrics_of(summary: dict[str, Any]) -> dict[str, float]:
    out = {
        f"{d}.{s}": summary[d][s] for d in KEPT_DISTRIBUTIONS for s in KEPT_STATS if summary.get(d)
    }
    out |= {k: summary[k] for k in SCALARS}
    out["valid"] = float(summary["valid"])
    target = (summary.get("config") or {}).get("target") or {}
    out["simulated"] = float(target.get("kind") == "simulated")  # bench run --engine sim
    for key, value in (summary.get("telemetry") or {}).items():  # peak RSS, KV blocks, ...
        if isinstance(value, int | float) and key != "samples":
            out[f"telemetry.{key}"] = value
    out["slo_attainment"] = slo_attainment(summary)
    cached = summary.get("total_cached_tokens")  # only where the server's usage reports it
    if cached is not None:
        out["prompt_tokens_computed"] = summary["total_input_tokens"] - cached
    for name, c in (summary.get("classes") or {}).items():  # a mix: each class's headline
        out |= {f"class.{name}.{k}": v for k, v in class_metrics(c).items()}
    return out


def class_metrics(summary: dict[str, Any]) -> dict[str, float | None]:
    """What sweep.csv keeps of one traffic class: its latency p50/p99, throughputs, goodput
    by its own SLO and attainment (class.NAME.ttft_s.p99, ...)."""
    out = {f"{d}.{s}": summary[d][s] for d in CLASS_DISTRIBUTIONS for s in ("p50", "p99")}
    out |= {k: summary[k] for k in CLASS_SCALARS}
    out["slo_attainment"] = slo_attainment(summary)
    cached = summary.get("total_cached_tokens")  # only where the server's usage reports it
    if cached is not None:
        out["prompt_tokens_computed"] = summary["total_input_tokens"] - cached
    return out


def slo_attainment(summary: dict[str, Any]) -> float | None:
    """The fraction of all requests sent that met every SLO (DistServe): a failed request is a
    miss, not left out, or a server that fails its slow requests would look better for it."""
    if summary.get("goodput") is None:
        return None  # no SLO given
    sent = summary["completed"] + summary["failed"] + summary.get("cancelled", 0)
    if not summary["completed"]:
        return 0.0 if sent else None
    # goodput and request_throughput share the run's duration: their ratio is good / completed
    good = summary["goodput"] / summary["request_throughput"] * summary["completed"]
    return good / sent


def aggregate(point: SweepPoint, summaries: list[dict[str, Any]]) -> dict[str, Any]:
    """One sweep.csv row: the point's settings, then each metric's mean over its runs, with
    `.std` and `.ci95` (half-width of the 95 % confidence interval) when repeated."""
    row: dict[str, Any] = {"point": point.index, **point.values}
    row |= {k: v for k, v in point.settings.items() if k not in row}  # a bundle's settings
    row["runs"] = len(summaries)
    # runs that flagged themselves INVALID (schedule not kept): shown wherever the point is
    row["invalid_runs"] = sum(not s.get("valid", True) for s in summaries)
    runs = [metrics_of(s) for s in summaries]
    for key in dict.fromkeys(k for r in runs for k in r):  # every run's keys, in order
        values = np.array([r[key] for r in runs if r.get(key) is not None], dtype=np.float64)
        row[key] = float(values.mean()) if len(values) else None
        if len(summaries) > 1:
            std = float(values.std(ddof=1)) if len(values) > 1 else math.nan
            row[f"{key}.std"] = std
            row[f"{key}.ci95"] = t975(len(values) - 1) * std / math.sqrt(len(values))
    return row


@dataclass(frozen=True, slots=True)
class Sweep:
    """What every run of a sweep shares: where it writes, what it runs, how it prints."""

    base: dict[str, Any]
    flags: dict[str, Any]
    sweep_dir: Path
    name: str
    repeat: int
    dashboard: bool
    console: Console
    serve: ServeCommand | None = None  # --serve-cmd: a server of ours started per run

    def run(self, point: SweepPoint, k: int, total: int) -> dict[str, Any] | int:
        """Run k of a point (or the one an earlier attempt finished): its summary, or the exit
        code when it could not run."""
        from engine.model.sources import ModelLoadError

        repeat, console = self.repeat, self.console
        out = self.sweep_dir / point.dirname / (f"run{k + 1}" if repeat > 1 else "")
        title = escape(f"[{point.index + 1}/{total}] {point.label}") + (
            f" (run {k + 1}/{repeat})" if repeat > 1 else ""
        )
        summary = _finished(out)
        if summary is not None:
            console.print(f"{title}: done before, kept")
        else:
            console.rule(title)
            shutil.rmtree(out, ignore_errors=True)  # an unfinished attempt
            server: ServerProcess | None = None
            try:
                flags = _point_flags(self.flags, point, out)
                if self.serve is not None:  # the server first: its base URL is the run's
                    out_dir = run_dir(str(out), self.name)
                    server, flags = self._start_server(point, out_dir)
                cfg = resolve_config(self.base, flags)
                if cfg.save_vllm_json:  # one file a point, in its folder: never one over another
                    cfg = replace(cfg, save_vllm_json=str(out / Path(cfg.save_vllm_json).name))
                if cfg.save_vllm_json:
                    check_vllm_json_path(cfg.save_vllm_json, str(out), overwrite=True)
                if server is None:
                    out_dir = run_dir(str(out), self.name)
                summary = run_one(cfg, out_dir, self.dashboard, console, report=False)
            except (ServerStartError, ValueError, ModelLoadError) as e:
                console.print(f"[bold red]error at {title}:[/] {escape(str(e))}", highlight=False)
                return 2
            finally:
                if server is not None:  # every way out: an interrupt, an error, the end
                    server.stop()
            if self.serve is not None:
                try:
                    self.serve.after_point(out_dir / "after_point.log")
                except (ValueError, OSError) as e:
                    console.print(f"[bold red]error at {title}:[/] {escape(str(e))}")
                    return 2
            if probe_failed(summary):  # the server refuses: every point would fail alike
                message = escape(summary["stopped_early"])
                console.print(f"[bold red]error at {title}:[/] {message}", highlight=False)
                return 1
        if not summary["interrupted"]:
            grew = (summary.get("ttft_growth") or {}).get("grew")
            console.print(
                f"  {summary['completed']} ok, {summary['failed']} failed, "
                f"{summary['output_throughput']:.1f} out tok/s, TTFT p99 "
                f"{(summary['ttft_s']['p99'] or 0) * 1e3:.0f} ms"
                + ("; TTFT grew through the run: over capacity" if grew else "")
                + ("; [bold red]INVALID[/]: schedule not kept" if not summary["valid"] else ""),
                highlight=False,
            )
        return summary

    def point_row(self, point: SweepPoint, total: int) -> dict[str, Any] | int:
        """Every run of a point: its sweep.csv row, or the exit code that ends the sweep."""
        summaries = []
        for k in range(self.repeat):
            summary = self.run(point, k, total)
            if isinstance(summary, int):
                return summary
            if summary["interrupted"]:
                self.console.print("[yellow]interrupted[/]: finished points are kept (--resume)")
                return exit_code(summary)
            summaries.append(summary)
        return aggregate(point, summaries)

    def _start_server(
        self, point: SweepPoint, out_dir: Path
    ) -> tuple[ServerProcess, dict[str, Any]]:
        """Start the point's --serve-cmd server (its output in server.log, what it ran in
        server.json); the run's flags, pointed at it."""
        assert self.serve is not None
        server, base_url = self.serve.server(point.settings, out_dir / "server.log")
        write_json(out_dir / "server.json", {"cmd": server.cmd, "settings": point.settings})
        with self.console.status(escape(f"starting `{shlex.join(server.cmd)}` ...")):
            server.start(self.serve.ready_timeout)
        run_point = replace(point, settings=self.serve.run_settings(point.settings))
        flags = _point_flags(self.flags, run_point, out_dir) | {"base_url": base_url}
        return server, flags


def run_sweep(
    profile: str | dict[str, Any],
    flags: dict[str, Any],
    repeat: int,
    resume: str | None,
    dashboard: bool,
    console: Console,
    rates: str | None = None,
    serve: ServeCommand | None = None,
    search: str | None = None,
    target: float | None = None,
) -> int:
    """`target`: --slo-target, the share of requests in SLO that makes a load served."""
    with raising_on_signals():
        try:
            return _run_sweep(
                profile, flags, repeat, resume, dashboard, console, rates, serve, search, target
            )
        except Interrupted as e:  # outside a point's load (which handles signals itself)
            console.print(
                f"[yellow]interrupted[/] by {e.name}: finished points are kept (--resume)"
            )
            return e.exit_code


def _run_sweep(
    profile: str | dict[str, Any],
    flags: dict[str, Any],
    repeat: int,
    resume: str | None,
    dashboard: bool,
    console: Console,
    rates: str | None = None,
    serve: ServeCommand | None = None,
    search: str | None = None,
    target: float | None = None,
) -> int:
    import pandas as pd

    from bench_cli.sweep_search import SearchSpec
    from engine.model.sources import ModelLoadError

    try:
        spec = RateSpec.parse(rates) if rates is not None else None
        found_by = SearchSpec.parse(search) if search is not None else None
        check_slo_target(target)
        base, axes = load_sweep(profile, required=spec is None and found_by is None)
        if found_by is not None and (spec is not None or set(axes) & set(LOAD_AXES)):
            raise ValueError("--slo-search finds the rate itself: no --rates, no sweep.rate")
        if spec is not None:
            axes = apply(spec, axes)
        check_load_flags(flags, axes, spec)
        name = flags.get("name") or base.get("name", "sweep")
        sweep_dir = Path(resume) if resume else run_dir(flags.get("out"), name)
        plan = redact_settings({"profile": base, "axes": axes, "repeat": repeat, "flags": flags})
        if serve is not None:
            plan["serve"] = serve.record()
        if found_by is not None:
            plan["slo_search"] = search
        if target is not None:
            plan["slo_target"] = target
        auto = spec.auto if spec is not None else None
        anchors = None
        if spec is not None:
            plan["rates"] = spec.text
        if auto:
            anchors = _stored_anchors(sweep_dir) if resume else None
            if anchors is not None:  # the rates it started with, not measured again
                plan |= {"axes": auto_axes(axes, anchors["between"]), "anchors": anchors}
            elif not _counted(base, flags):
                raise ValueError(
                    "--rates auto: its throughput point sends every request at once, so the "
                    "profile (or --num-requests) must set num_requests, without --duration"
                )
        _check_resume(sweep_dir, plan, resume is not None)
        planned = auto_axes(axes, [1.0] * (auto - 2)) if auto and not anchors else plan["axes"]
        if found_by is not None:  # the rates come later: check the settings at LO
            planned = planned | {"rate": [found_by.low]}
        if found_by is not None or target is not None:
            first = resolve_config(base, _check_flags(flags, grid(planned)[0], sweep_dir, serve))
            if first.slo is None:
                given = "--slo-search" if found_by is not None else "--slo-target"
                raise ValueError(f'{given} needs an SLO: the profile\'s slo = "ttft=..."')
        if serve is not None:  # before anything starts: every key reaches the server or load
            serve.check(grid(planned), RUN_KEYS)
        for point in grid(planned):  # every point's config must resolve before the first runs
            resolve_config(base, _check_flags(flags, point, sweep_dir, serve))
    except (ValueError, OSError, ModelLoadError) as e:
        console.print(f"[bold red]error:[/] {escape(str(e))}", highlight=False)
        return 2
    write_json(sweep_dir / "sweep.json", plan)
    total = len(grid(planned))
    console.print(
        escape(f"sweep {name}: {total} points x {repeat} runs -> {sweep_dir}/"),
        highlight=False,
    )
    sweep = Sweep(base, flags, sweep_dir, name, repeat, dashboard, console, serve)
    if spec is not None and spec.auto and anchors is None:
        found = _find_anchors(sweep, spec, axes, total)
        if isinstance(found, int):
            return found
        plan |= {"axes": auto_axes(axes, found["between"]), "anchors": found}
        write_json(sweep_dir / "sweep.json", plan)
    axes = plan["axes"]
    rows: list[dict[str, Any]] = []
    if found_by is not None:
        from bench_cli.sweep_search import run_search

        save = functools.partial(_write_csv, sweep_dir, rows, pd)
        code = run_search(
            sweep.point_row, found_by, axes, rows, save, console, sweep_dir, target_of(plan)
        )
        if code is not None:
            return code
        axes = axes | {"rate": sorted({r["rate"] for r in rows})}
    for point in [] if found_by is not None else grid(axes):
        row = sweep.point_row(point, total)
        if isinstance(row, int):
            return row
        rows.append(row)
        _write_csv(sweep_dir, rows, pd)
    load_axes = [a for a in axes if a in LOAD_AXES]
    print_comparison(console, rows, list(axes), load_axes, target_of(plan))
    print_verdict(console, rows, list(axes), plan)
    from bench_cli.report import sweep_report

    if found_by is not None:  # the rates tested, for the report's load axis
        write_json(sweep_dir / "sweep.json", plan | {"report_axes": axes})
    sweep_report(sweep_dir)
    console.print(f"sweep results: {sweep_dir}/sweep.csv and report.html", highlight=False)
    return INVALID_EXIT if any(invalid(r) for r in rows) else 0


def _find_anchors(
    sweep: Sweep, spec: RateSpec, settings: dict[str, list[Any]], total: int
) -> dict[str, Any] | int:
    """Run the first setting's synchronous and throughput points (every repeat) before the
    rest: their mean achieved request rates are the ends of the rates between."""
    assert spec.auto is not None
    points = anchor_points(settings, spec.auto)
    achieved = []
    for point in points:
        summaries = []
        for k in range(sweep.repeat):
            summary = sweep.run(point, k, total)
            if isinstance(summary, int):
                return summary
            if summary["interrupted"]:
                sweep.console.print("[yellow]interrupted[/]: finished points are kept (--resume)")
                return exit_code(summary)
            summaries.append(summary)
        rate = float(np.mean([s["request_throughput"] for s in summaries]))
        if not rate > 0:
            sweep.console.print(
                f"[bold red]error:[/] no request of {escape(point.label)} succeeded: "
                "no rate to start the sweep from",
                highlight=False,
            )
            return 1
        achieved.append(rate)
    # the arrival kind of the rates between: the profile's (a throughput point is sent by it)
    arrival = resolve_config(sweep.base, _point_flags(sweep.flags, points[1], sweep.sweep_dir))
    found = anchors_record(spec, arrival.arrival, points, (achieved[0], achieved[1]))
    between_text = ", ".join(f"{r:g}" for r in found["between"])
    sweep.console.print(
        f"anchors: synchronous {achieved[0]:.2f} req/s, throughput {achieved[1]:.2f} req/s -> "
        f"{arrival.arrival} rates {between_text}",
        highlight=False,
    )
    if achieved[1] <= achieved[0]:
        sweep.console.print(
            "[yellow]note:[/] the throughput point served no more requests/s than one at a "
            "time: the rates between do not rise",
            highlight=False,
        )
    return found


def check_slo_target(target: float | None) -> None:
    """--slo-target is a share of requests: 0 < x <= 1 (0.9: 90 % of requests in SLO)."""
    if target is not None and not 0 < target <= 1:
        raise ValueError(f"--slo-target {target}: give a share of requests, 0 < x <= 1 (0.9)")


def _counted(base: dict[str, Any], flags: dict[str, Any]) -> bool:
    """Each point sends a set number of requests (--duration drops the profile's count)."""
    if flags.get("num_requests") is not None:
        return True
    return base.get("num_requests") is not None and flags.get("duration") is None


def _stored_anchors(sweep_dir: Path) -> dict[str, Any] | None:
    """The anchors a sweep being resumed measured (None when it stopped before)."""
    try:
        return json.loads((sweep_dir / "sweep.json").read_text()).get("anchors")
    except (OSError, ValueError):
        return None  # _check_resume says why


def _point_flags(flags: dict[str, Any], point: SweepPoint, out: Path) -> dict[str, Any]:
    given = {k: v for k, v in flags.items() if v is not None and k not in ("name", "out")}
    return given | point.settings | {"out": str(out), "name": point.dirname}


def _check_flags(
    flags: dict[str, Any], point: SweepPoint, out: Path, serve: ServeCommand | None
) -> dict[str, Any]:
    """A point's flags as its run will get them (a --serve-cmd server's URL: a stand-in)."""
    if serve is None:
        return _point_flags(flags, point, out)
    run_point = replace(point, settings=serve.run_settings(point.settings))
    return _point_flags(flags, run_point, out) | {"base_url": "http://127.0.0.1:1/v1"}


def _finished(out: Path) -> dict[str, Any] | None:
    try:
        summary = json.loads((out / "summary.json").read_text())
    except (OSError, ValueError):
        return None
    return None if summary.get("interrupted") or probe_failed(summary) else summary


def probe_failed(summary: dict[str, Any]) -> bool:
    """The run's test request failed: nothing was measured, the server refused it."""
    return (summary.get("test_request") or {}).get("status") == "error"


def _check_resume(sweep_dir: Path, plan: dict[str, Any], resuming: bool) -> None:
    if not resuming:
        return
    try:
        before = json.loads((sweep_dir / "sweep.json").read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"--resume {sweep_dir}: not a sweep folder ({e})") from e
    keys = (set(before) | set(plan)) - {"report_axes"}  # written at the end, from the results
    changed = sorted(k for k in keys if _results_part(before, k) != _results_part(plan, k))
    if changed:
        raise ValueError(f"--resume {sweep_dir}: changed since it started: {', '.join(changed)}")


# Where a sweep's results go, what it is called and how it logs in change none of its numbers:
# a sweep started with --out DIR (or --api-key) resumes from plain `--resume DIR`.
NOT_RESULTS = ("name", "out", "api_key")


def _results_part(plan: dict[str, Any], key: str) -> Any:
    """`plan[key]` as sweep.json holds it, less what does not change results."""
    value = _as_written(plan.get(key))
    if isinstance(value, dict) and key in ("profile", "flags"):
        value = {k: v for k, v in value.items() if k not in NOT_RESULTS and v is not None}
    return value


def _as_written(value: Any) -> Any:
    """As write_json stores it: tuples as lists, an infinite rate as "inf"."""
    if isinstance(value, float) and not math.isfinite(value):
        return None if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, dict):
        return {str(k): _as_written(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_as_written(v) for v in value]
    return value


def _write_csv(sweep_dir: Path, rows: list[dict[str, Any]], pd: Any) -> None:
    if rows:
        pd.DataFrame(rows).to_csv(sweep_dir / "sweep.csv", index=False)
