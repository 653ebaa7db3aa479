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
found automatically (`auto:N`, guidellm's sweep: see bench_cli.sweep.rates)."""

from __future__ import annotations

import functools
import json
import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.markup import escape

from bench_cli.console import print_error
from bench_cli.export import run_dir, write_json
from bench_cli.run.execute import INVALID_EXIT, resolve_config
from bench_cli.run.interrupts import Interrupted, raising_on_signals
from bench_cli.sweep.grid import LOAD_AXES, SweepPoint, grid, load_sweep
from bench_cli.sweep.options import SweepOptions
from bench_cli.sweep.point import Sweep, point_flags
from bench_cli.sweep.rates import (
    RateSpec,
    anchor_points,
    anchors_record,
    apply,
    auto_axes,
    check_load_flags,
)
from bench_cli.sweep.serve_cmd import ServeCommand
from bench_cli.sweep.table import invalid, print_comparison
from bench_cli.sweep.verdict import print_verdict
from bench_cli.sweep.verdict import slo_target_of as target_of
from loadgen.profiles import setting_names
from loadgen.redact import redact_settings, redact_url


def run_sweep(
    profile: str | dict[str, Any],
    flags: dict[str, Any],
    options: SweepOptions,
    console: Console,
) -> int:
    """The sweep's exit code. `options.target`: --slo-target, the share of requests in SLO
    that makes a load served; `options.ray_address`: the points at once as Ray tasks
    (bench_cli/sweep/ray.py)."""
    with raising_on_signals():
        try:
            return _run_sweep(profile, flags, options, console)
        except Interrupted as e:  # outside a point's load (which handles signals itself)
            console.print(
                f"[yellow]interrupted[/] by {e.name}: finished points are kept (--resume)"
            )
            return e.exit_code


def _run_sweep(
    profile: str | dict[str, Any],
    flags: dict[str, Any],
    options: SweepOptions,
    console: Console,
) -> int:
    import pandas as pd

    from bench_cli.sweep.search import SearchSpec
    from engine.model.sources import ModelLoadError

    repeat, resume, serve, target = options.repeat, options.resume, options.serve, options.target
    rates, search, ray_address = options.rates, options.search, options.ray_address
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
        if ray_address is not None:
            plan["ray_address"] = ray_address
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
            serve.check(grid(planned), setting_names())  # load keys
        shared = None  # --ray-address: the one server every point loads at once
        for point in grid(planned):  # every point's config must resolve before the first runs
            cfg = resolve_config(base, _check_flags(flags, point, sweep_dir, serve))
            if ray_address is not None:
                from bench_cli.sweep.ray import check_ray_sweep

                check_ray_sweep(cfg, bool(auto), found_by is not None)
                if serve is None and cfg.base_url and len(grid(planned)) * repeat > 1:
                    shared = redact_url(cfg.base_url)
    except (ValueError, OSError, ModelLoadError) as e:
        print_error(console, str(e))
        return 2
    write_json(sweep_dir / "sweep.json", plan)
    total = len(grid(planned))
    console.print(
        escape(f"sweep {name}: {total} points x {repeat} runs -> {sweep_dir}/"),
        highlight=False,
        soft_wrap=True,
    )
    sweep = Sweep(base, flags, sweep_dir, name, repeat, options.dashboard, console, serve)
    if spec is not None and spec.auto and anchors is None:
        found = _find_anchors(sweep, spec, axes, total)
        if isinstance(found, int):
            return found
        plan |= {"axes": auto_axes(axes, found["between"]), "anchors": found}
        write_json(sweep_dir / "sweep.json", plan)
    axes = plan["axes"]
    rows: list[dict[str, Any]] = []
    if found_by is not None:
        from bench_cli.sweep.search import run_search

        save = functools.partial(_write_csv, sweep_dir, rows, pd)
        code = run_search(
            sweep.point_row, found_by, axes, rows, save, console, sweep_dir, target_of(plan)
        )
        if code is not None:
            return code
        axes = axes | {"rate": sorted({r["rate"] for r in rows})}
    if ray_address is not None:
        code = _run_on_ray(sweep, grid(axes), total, ray_address, shared, rows, pd)
        if code is not None:
            return code
    for point in [] if found_by is not None or ray_address is not None else grid(axes):
        row = sweep.point_row(point, total)
        if isinstance(row, int):
            return row
        rows.append(row)
        _write_csv(sweep_dir, rows, pd)
    load_axes = [a for a in axes if a in LOAD_AXES]
    print_comparison(console, rows, list(axes), load_axes, target_of(plan))
    print_verdict(console, rows, list(axes), plan)
    from bench_cli.report.sweep import sweep_report

    if found_by is not None:  # the rates tested, for the report's load axis
        write_json(sweep_dir / "sweep.json", plan | {"report_axes": axes})
    sweep_report(sweep_dir)
    console.print(
        f"sweep results: {sweep_dir}/sweep.csv and report.html", highlight=False, soft_wrap=True
    )
    return INVALID_EXIT if any(invalid(r) for r in rows) else 0


def _run_on_ray(
    sweep: Sweep,
    points: list[SweepPoint],
    total: int,
    address: str,
    shared: str | None,
    rows: list[dict[str, Any]],
    pd: Any,
) -> int | None:
    """The points at once as Ray tasks; `rows` filled in grid order (sweep.csv rewritten as
    each point ends, as a serial sweep does); the exit code when the sweep ended early."""
    from bench_cli.sweep.ray import run_points

    if shared is not None:
        sweep.console.print(
            f"[yellow]note:[/] every point loads {escape(shared)} at the same time: each "
            "point's numbers are under the others' load too (each summary says so)",
            highlight=False,
        )

    def config_of(point: SweepPoint, out: Path) -> Any:
        return resolve_config(sweep.base, _check_flags(sweep.flags, point, out, sweep.serve))

    def save(by_index: dict[int, dict[str, Any]]) -> None:
        rows[:] = [by_index[i] for i in sorted(by_index)]
        _write_csv(sweep.sweep_dir, rows, pd)

    done = run_points(sweep, points, total, address, shared, config_of, save)
    if isinstance(done, int):
        return done
    save(done)
    return None


def _find_anchors(
    sweep: Sweep, spec: RateSpec, settings: dict[str, list[Any]], total: int
) -> dict[str, Any] | int:
    """Run the first setting's synchronous and throughput points (every repeat) before the
    rest: their mean achieved request rates are the ends of the rates between."""
    assert spec.auto is not None
    points = anchor_points(settings, spec.auto)
    achieved = []
    for point in points:
        summaries = sweep.summaries(point, total)
        if isinstance(summaries, int):
            return summaries
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
    arrival = resolve_config(sweep.base, point_flags(sweep.flags, points[1], sweep.sweep_dir))
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


def _check_flags(
    flags: dict[str, Any], point: SweepPoint, out: Path, serve: ServeCommand | None
) -> dict[str, Any]:
    """A point's flags as its run will get them (a --serve-cmd server's URL: a stand-in)."""
    if serve is None:
        return point_flags(flags, point, out)
    run_point = replace(point, settings=serve.run_settings(point.settings))
    return point_flags(flags, run_point, out) | {"base_url": "http://127.0.0.1:1/v1"}


def _check_resume(sweep_dir: Path, plan: dict[str, Any], resuming: bool) -> None:
    if not resuming:
        return
    try:
        before = json.loads((sweep_dir / "sweep.json").read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"--resume {sweep_dir}: not a sweep folder ({e})") from e
    # report_axes: written at the end, from the results; slo_target: judges them, as the lag limit
    keys = (set(before) | set(plan)) - {"report_axes", "slo_target", "ray_address"}
    changed = sorted(k for k in keys if _results_part(before, k) != _results_part(plan, k))
    if changed:
        raise ValueError(f"--resume {sweep_dir}: changed since it started: {', '.join(changed)}")


# Where a sweep's results go, what it is called and how it logs in change none of its numbers,
# nor does the lag limit that judges its schedule (INVALID points run again on --resume): a
# sweep started with --out DIR (or --api-key) resumes from plain `--resume DIR`.
NOT_RESULTS = ("name", "out", "api_key", "max_p99_lag_ms")


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
