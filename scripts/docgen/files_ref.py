"""A run's files and their columns: the file list from bench_cli/export.py, requests.jsonl
from `RequestRecord`, summary.csv and sweep.csv from the functions that write them (called on
a made-up summary), timeline.csv from the telemetry's gauges, steps.jsonl from the engine's
step-log line."""

from __future__ import annotations

import dataclasses
from typing import Any

from bench_cli.export import RUN_FILES, summary_row
from bench_cli.sweep.grid import SweepPoint
from bench_cli.sweep.row import aggregate
from engine.model.cost import StepCost, StepShape
from engine.step_log import StepLog
from loadgen import metric_registry
from loadgen.machine_cpu import STEAL_WARN
from loadgen.records import RequestRecord
from loadgen.telemetry import ENGINE_GAUGES
from scripts.docgen.markdown import code, page, table
from scripts.docgen.metrics_ref import sample_summary
from scripts.docgen.source import dict_key_comments, field_comments

FILES = {
    "config.json": "the resolved run config, the engine's whole resolved config (bundled "
    "engine), the server's kind and version, package versions, git commit, hardware",
    "requests.jsonl": "one record a request, appended as it ends (columns below)",
    "summary.json": "the metrics ([metrics](metrics.md)), warnings, telemetry peaks and means, "
    "the definitions used",
    "summary.csv": "summary.json flattened to one row (columns below)",
    "timeline.csv": "telemetry sampled every `--telemetry-interval` (0.1 s) on the records' "
    "clock (columns below)",
    "report.html": "plots and tables of all of it; `bench report DIR` rebuilds it",
    "steps.jsonl": "bundled engine only: one line an engine step (fields below)",
    "server.log": "bundled engine only: the server's output",
}


def _summary_columns() -> list[tuple[str, str]]:
    by_column = {m.column: m for m in metric_registry.METRICS.values()}
    out = []
    for col in summary_row(sample_summary()):
        key, _, stat = col.partition(".")
        if key in ("slo", "tokens_counted_by"):
            what = "the SLO bound, s" if key == "slo" else "requests whose tokens were counted so"
        elif stat == "count":
            what = "requests"
        else:
            what = by_column[key].unit
        out.append((col, what))
    return out


def _sweep_columns() -> list[str]:
    point = SweepPoint(index=0, values={"rate": 1.0}, settings={})
    summaries = [sample_summary() | {"config": {}, "telemetry": {}}]
    return list(aggregate(point, summaries))


def _step_log_keys() -> list[tuple[str, str]]:
    """The keys of the engine's step-log line with their comments, then its shape and cost."""
    keys = dict_key_comments(StepLog.write)
    shape = field_comments(StepShape)
    out = list(keys.items())
    out += [(f.name, shape.get(f.name, "")) for f in dataclasses.fields(StepShape)]
    out += [(f.name, COST[f.name]) for f in dataclasses.fields(StepCost)]
    return out


COST = {
    "flops": "model FLOPs of the step (engine/model/cost.py)",
    "weight_bytes": "weight bytes the step must read",
    "kv_read_bytes": "KV bytes its attention reads",
    "kv_write_bytes": "KV bytes it writes",
}


def _describe(name: str, rows: list[Any], header: list[str]) -> str:
    return f"## {name}\n\n" + table(header, rows)


def files_page() -> str:
    missing = set(RUN_FILES) - set(FILES)
    if missing:
        raise KeyError(f"describe {sorted(missing)} in scripts/docgen/files_ref.py")
    parts = [
        _describe(
            "A run's folder", [(code(f), FILES[f]) for f in RUN_FILES], ["file", "what it holds"]
        )
    ]
    comments = field_comments(RequestRecord)
    rows = [
        (code(f.name), comments.get(f.name, ""))
        for f in dataclasses.fields(RequestRecord)
        if f.name != "reply"
    ]
    parts.append(
        "## requests.jsonl\n\nOne JSON object a request. "
        + (RequestRecord.__doc__ or "").strip()
        + "\n\n"
        + table(["field", "meaning"], rows)
    )
    rows = [(code(c), u) for c, u in _summary_columns()]
    parts.append(
        "## summary.csv\n\nOne row; a distribution's statistics are `KEY.STAT` columns in "
        "seconds. Keys a run adds beside these (config, telemetry peaks, traffic classes as "
        "`classes.NAME.*`, `arrival_check.*`, `interrupted`, ...) follow them.\n\n"
        + table(["column", "unit"], rows)
    )
    gauges = [
        (code(f"engine_{key}"), ", ".join(code(n) for n in names))
        for key, names in ENGINE_GAUGES.items()
        if key != "rss_bytes"
    ]
    parts.append(
        "## timeline.csv\n\n`t_s` (seconds on the records' clock); with NVML per GPU i "
        "`gpu{i}_util_percent`, `gpu{i}_memory_used_mb`, `gpu{i}_memory_total_mb`, "
        "`gpu{i}_power_w`, `gpu{i}_sm_clock_mhz`; for a server process of ours "
        "`server_cpu_percent` (100 = one core busy) and `server_rss_mb`; for the whole "
        "machine `machine_cpu_percent` (every process's CPU, 100 = one core) and, on Linux, "
        "`machine_steal_percent` (CPU time a hypervisor gave to other guests; a run where it "
        f"reaches {STEAL_WARN:.0%} of the machine's CPU time warns); and, scraped from "
        "the server's /metrics (ours, vLLM's, SGLang's or llama.cpp's names), these "
        "columns:\n\n" + table(["column", "read from"], gauges)
    )
    cols = ", ".join(code(c) for c in _sweep_columns())
    parts.append(
        "## sweep.csv\n\nOne row a point: `point`, the point's settings (one column an axis "
        "or bundled setting), `runs`, `invalid_runs`, then each metric's mean over the "
        "point's runs, with `.std` and `.ci95` (half-width of the 95 % interval) when "
        "repeated, `class.NAME.*` for traffic classes and `telemetry.*` peaks. For a rate "
        f"axis, run once, the columns are:\n\n{cols}\n"
    )
    parts.append(
        _describe("steps.jsonl", [(code(k), v) for k, v in _step_log_keys()], ["field", "meaning"])
        + "\n`t` is on the shared perf_counter clock: subtract summary.json's `clock_t0` to "
        "align it with the records.\n"
    )
    intro = (
        "What `bench run` writes in `results/<time>-<name>/` (or `--out DIR`), with every "
        "column. Units: seconds unless the name says otherwise (`_mb`, `_percent`, `_w`, "
        "`_bytes`); throughputs per second. Results are strict JSON: `--rate inf` is written "
        '`"inf"`, a missing statistic `null`.'
    )
    return page("Result files", "bench_cli/export.py, loadgen/records.py", intro, "\n".join(parts))
