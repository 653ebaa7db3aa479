"""A sweep's points run one by one: each run (and repeat) in its own folder, the bundled
engine or a --serve-cmd server started for it and stopped on every way out, a run an earlier
attempt finished kept (--resume), and the point's sweep.csv row from its runs."""

from __future__ import annotations

import json
import shlex
import shutil
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

from bench_cli.export import run_dir, write_json
from bench_cli.local_server import ServerProcess, ServerStartError
from bench_cli.run.execute import exit_code, resolve_config, run_one
from bench_cli.run.vllm_json import check_vllm_json_path
from bench_cli.sweep.grid import SweepPoint
from bench_cli.sweep.row import aggregate
from bench_cli.sweep.serve_cmd import ServeCommand


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
    # where the runs write, when not in sweep_dir itself: a Ray task's folder on its node,
    # shipped to the driver's sweep_dir after (bench_cli/sweep/ray.py); configs name sweep_dir
    stage: Path | None = None

    def run(self, point: SweepPoint, k: int, total: int) -> dict[str, Any] | int:
        """Run k of a point (or the one an earlier attempt finished): its summary, or the exit
        code when it could not run."""
        from engine.model.sources import ModelLoadError

        repeat, console = self.repeat, self.console
        out = self.sweep_dir / point.dirname / (f"run{k + 1}" if repeat > 1 else "")
        where = out if self.stage is None else self.stage / out.relative_to(self.sweep_dir)
        title = escape(f"[{point.index + 1}/{total}] {point.label}") + (
            f" (run {k + 1}/{repeat})" if repeat > 1 else ""
        )
        summary = finished(where)
        if summary is not None:
            console.print(f"{title}: done before, kept")
        else:
            console.rule(title)
            shutil.rmtree(where, ignore_errors=True)  # an unfinished attempt
            server: ServerProcess | None = None
            try:
                flags = point_flags(self.flags, point, out)
                if self.serve is not None:  # the server first: its base URL is the run's
                    out_dir = run_dir(str(where), self.name)
                    server, flags = self._start_server(point, out_dir, out)
                cfg = resolve_config(self.base, flags)
                if cfg.save_vllm_json:  # one file a point, in its folder: never one over another
                    cfg = replace(cfg, save_vllm_json=str(where / Path(cfg.save_vllm_json).name))
                if cfg.save_vllm_json:
                    check_vllm_json_path(cfg.save_vllm_json, str(where), overwrite=True)
                if server is None:
                    out_dir = run_dir(str(where), self.name)
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
            print_outcome(console, summary)
        return summary

    def summaries(self, point: SweepPoint, total: int) -> list[dict[str, Any]] | int:
        """Every run of a point, one after another: their summaries, or the exit code that
        ends the sweep (a run that could not run, or one interrupted)."""
        summaries = []
        for k in range(self.repeat):
            summary = self.run(point, k, total)
            if isinstance(summary, int):
                return summary
            if summary["interrupted"]:
                self.console.print("[yellow]interrupted[/]: finished points are kept (--resume)")
                return exit_code(summary)
            summaries.append(summary)
        return summaries

    def point_row(self, point: SweepPoint, total: int) -> dict[str, Any] | int:
        """Every run of a point: its sweep.csv row, or the exit code that ends the sweep."""
        summaries = self.summaries(point, total)
        return summaries if isinstance(summaries, int) else aggregate(point, summaries)

    def _start_server(
        self, point: SweepPoint, out_dir: Path, out: Path
    ) -> tuple[ServerProcess, dict[str, Any]]:
        """Start the point's --serve-cmd server (its output in server.log, what it ran in
        server.json, both in out_dir); the run's flags (results in `out`), pointed at it."""
        assert self.serve is not None
        server, base_url = self.serve.server(point.settings, out_dir / "server.log")
        write_json(out_dir / "server.json", {"cmd": server.cmd, "settings": point.settings})
        with self.console.status(escape(f"starting `{shlex.join(server.cmd)}` ...")):
            server.start(self.serve.ready_timeout)
        run_point = replace(point, settings=self.serve.run_settings(point.settings))
        flags = point_flags(self.flags, run_point, out) | {"base_url": base_url}
        return server, flags


def print_outcome(console: Console, summary: dict[str, Any]) -> None:
    """A finished run's line under its point's title."""
    grew = (summary.get("ttft_growth") or {}).get("grew")
    console.print(
        f"  {summary['completed']} ok, {summary['failed']} failed, "
        f"{summary['output_throughput']:.1f} out tok/s, TTFT p99 "
        f"{(summary['ttft_s']['p99'] or 0) * 1e3:.0f} ms"
        + ("; TTFT grew through the run: over capacity" if grew else "")
        + ("; [bold red]INVALID[/]: schedule not kept" if not summary["valid"] else ""),
        highlight=False,
    )


def point_flags(flags: dict[str, Any], point: SweepPoint, out: Path) -> dict[str, Any]:
    given = {k: v for k, v in flags.items() if v is not None and k not in ("name", "out")}
    return given | point.settings | {"out": str(out), "name": point.dirname}


def finished(out: Path) -> dict[str, Any] | None:
    try:
        summary = json.loads((out / "summary.json").read_text())
    except (OSError, ValueError):
        return None
    # an INVALID run did not offer the load asked for: a resumed sweep runs it again
    again = summary.get("interrupted") or probe_failed(summary) or not summary.get("valid", True)
    return None if again else summary


def probe_failed(summary: dict[str, Any]) -> bool:
    """The run's test request failed: nothing was measured, the server refused it."""
    return (summary.get("test_request") or {}).get("status") == "error"
