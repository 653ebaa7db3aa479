"""A run's report.html, rebuilt from its folder alone (`bench report DIR`): latency CDFs,
request timeline, throughput and telemetry over time, its engine steps and tables."""

from __future__ import annotations

import html
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from bench_cli.report.page import (
    SIMULATED_BANNER,
    Figure,
    has_data,
    ms,
    number,
    page,
    setting_colours,
)
from bench_cli.report.steps import steps_figure, utilization_text
from bench_cli.signals import signal
from bench_cli.tables import sim_title
from bench_cli.worker_view import worker_table_html
from loadgen.metric_registry import distributions
from loadgen.metrics import STATS, Latencies
from loadgen.records import RequestRecord, TokenTimes, read_records

# What one figure draws at most (a simulated hour has 360,000 requests and millions of token
# gaps): CDF points, requests drawn as lines. Summaries use every value.
CDF_POINTS, TIMELINE_REQUESTS = 4000, 2000
LATENCY_TITLES = {"TTFT": "TTFT", "ITL": "ITL", "TPOT": "TPOT", "E2E": "E2E latency"}


def _cdf(fig: Figure, values: Sequence[float], name: str, row: int, col: int, **line: Any) -> None:
    if len(values) == 0:
        return
    x = np.asarray(values) * 1e3  # a new array: sorted in place (an hour's ITLs are 370 MB)
    x.sort()
    y = np.arange(1, len(x) + 1) / len(x)
    if len(x) > CDF_POINTS:  # a long run's millions of gaps: the curve at a fine resolution
        keep = np.unique(np.linspace(0, len(x) - 1, CDF_POINTS).round().astype(int))
        x, y = x[keep], y[keep]
    fig.add_trace(go.Scatter(x=x, y=y, mode="lines", name=name, **line), row=row, col=col)


def _latencies(
    ok: list[RequestRecord], itl: np.ndarray | None = None
) -> dict[str, Sequence[float]]:
    """TTFT, ITL (within each sequence), TPOT (per sequence) and E2E of finished requests, as
    the summary computes them (itl: their pooled ITLs, where the caller has them)."""
    lat = Latencies.of(ok)
    return {
        "TTFT": lat.ttft,
        "ITL": itl if itl is not None else TokenTimes.of(ok).gaps(ok),
        "TPOT": lat.tpot,
        "E2E": lat.e2e,
    }


def finished(records: list[RequestRecord]) -> list[RequestRecord]:
    """The measured requests that succeeded: what the latency and throughput figures draw."""
    return [r for r in records if r.ok and not r.warmup]


def latency_figure(records: list[RequestRecord], itl: np.ndarray | None = None) -> Figure:
    """One CDF per latency; with traffic classes, one line per class in each (a legend).
    itl: the pooled ITLs of the finished requests (`finished`), where the caller has them."""
    ok = finished(records)
    classes = list(dict.fromkeys(r.cls for r in ok if r.cls is not None))
    groups = {c: [r for r in ok if r.cls == c] for c in classes} if classes else {"": ok}
    by_group = {g: _latencies(m, itl if m is ok else None) for g, m in groups.items()}
    # a panel only where some group has values (one-token outputs have no ITL or TPOT)
    drawn = [n for n in LATENCY_TITLES if any(len(lat[n]) for lat in by_group.values())]
    drawn = drawn or list(LATENCY_TITLES)  # nothing finished: the axes say so
    rows = -(-len(drawn) // 2)
    titles = [LATENCY_TITLES[n] for n in drawn]
    fig = make_subplots(rows=rows, cols=2, subplot_titles=titles)
    colours = setting_colours(groups)
    places = {name: (1 + i // 2, 1 + i % 2) for i, name in enumerate(drawn)}
    for group, latencies in by_group.items():
        for j, (name, values) in enumerate((n, latencies[n]) for n in drawn):
            row, col = places[name]
            line = {"line": {"color": colours[group]}, "legendgroup": group}
            _cdf(fig, values, group or name, row, col, showlegend=bool(classes) and j == 0, **line)
            fig.update_xaxes(title_text=f"{name} (ms)", row=row, col=col)
    fig.update_yaxes(title_text="fraction of requests (ITL: of gaps)", range=[0, 1])
    title = "Latency distributions (CDF)" + (", by traffic class" if classes else "")
    fig.update_layout(title=title, showlegend=bool(classes), height=325 * rows)
    return fig


def timeline_figure(records: list[RequestRecord]) -> Figure:
    """Each request as a line: grey from send to first chunk (TTFT), blue while streaming."""
    ok = sorted((r for r in records if r.ok and not r.warmup), key=lambda r: r.send_s or 0)
    stride = max(1, -(-len(ok) // TIMELINE_REQUESTS))  # 1 when nothing succeeded
    title = "Requests over time (sorted by send)"
    if stride > 1:
        title += f": every {stride}th of {len(ok)}"
    ok = ok[::stride]
    wait_x: list[float | None] = []
    wait_y: list[float | None] = []
    stream_x: list[float | None] = []
    stream_y: list[float | None] = []
    for i, r in enumerate(ok):
        wait_x += [r.send_s, r.first_chunk_s, None]
        wait_y += [i, i, None]
        stream_x += [r.first_chunk_s, r.end_s, None]
        stream_y += [i, i, None]
    fig = go.Figure()
    fig.add_trace(
        go.Scatter(
            x=wait_x,
            y=wait_y,
            mode="lines",
            name="waiting for the first token",
            line={"color": "#bbbbbb"},
        )
    )
    fig.add_trace(
        go.Scatter(
            x=stream_x, y=stream_y, mode="lines", name="streaming", line={"color": "#1f77b4"}
        )
    )
    failed = [r for r in records if not r.ok and not r.warmup and r.send_s is not None]
    if failed:
        fig.add_trace(
            go.Scatter(
                x=[r.send_s for r in failed],
                y=[0] * len(failed),
                mode="markers",
                name="failed",
                marker={"color": "red"},
            )
        )
    fig.update_layout(
        title=title,
        xaxis_title="time (s)",
        yaxis_title="request" + (f" (every {stride}th)" if stride > 1 else ""),
        height=450,
    )
    return fig


def throughput_figure(
    records: list[RequestRecord], timeline: pd.DataFrame | None, chunks: TokenTimes | None = None
) -> Figure:
    """Output tokens per second in 1 s bins, requests in flight, then the telemetry with one
    row (one y axis) per unit: RSS in MB beside CPU % on one axis made every line but RSS flat."""
    ok = finished(records)
    axes: dict[str, list[str]] = {}  # axis title -> columns drawn on it
    if timeline is not None:
        for col in timeline.columns:
            # a series zero (or missing) for the whole run, as the spec-decode counters of a
            # run without speculation, is no data: no panel, no legend entry (the live view
            # hides the same rows)
            drawn = timeline[col].fillna(0).ne(0).any()
            if col != "t_s" and not col.endswith("_total_mb") and drawn:
                axes.setdefault(signal(col).axis, []).append(col)
    # nothing finished: no token or in-flight panel to draw, only the telemetry
    titles = ["output tokens/s", "requests in flight"] if ok else []
    titles += list(axes)
    if not titles:  # no panel: run_report leaves a figure without data out
        return go.Figure(layout={"title": "Throughput and telemetry over time"})
    fig = make_subplots(
        rows=len(titles), cols=1, shared_xaxes=True, subplot_titles=titles, vertical_spacing=0.04
    )
    if ok:
        chunks = chunks if chunks is not None else TokenTimes.of(ok)
        end = max(r.end_s or 0 for r in ok)
        # 1-s bins over [0, last] (none if it ended at 0): numpy's equal-bin path, told a
        # count and range (given the edges, it sorts an hour's 46 M token times)
        last = math.ceil(end)
        counts, edges = np.histogram(
            chunks.times, bins=last or [0.0], range=(0.0, last), weights=chunks.tokens
        )
        fig.add_trace(
            go.Bar(x=edges[:-1] + 0.5, y=counts.astype(np.int64), name="output tok/s"), row=1, col=1
        )
        grid = np.linspace(0, end, 400)
        sends = np.sort([r.send_s or 0 for r in ok])
        ends = np.sort([r.end_s or 0 for r in ok])
        # started by t, less ended by t (a request is in flight over [send, end))
        in_flight = np.searchsorted(sends, grid, "right") - np.searchsorted(ends, grid, "right")
        fig.add_trace(go.Scatter(x=grid, y=in_flight, name="in flight", mode="lines"), row=2, col=1)
        fig.update_yaxes(title_text="tok/s", row=1, col=1)
        fig.update_yaxes(title_text="requests", row=2, col=1)
    for row, (axis, cols) in enumerate(axes.items(), start=3 if ok else 1):
        assert timeline is not None
        for col in cols:
            sig = signal(col)
            fig.add_trace(
                go.Scatter(
                    x=timeline["t_s"],
                    y=timeline[col],
                    name=f"{sig.label} ({sig.unit})" if sig.unit else sig.label,
                    mode="lines",
                    connectgaps=True,
                ),
                row=row,
                col=1,
            )
        fig.update_yaxes(title_text=axis, rangemode="tozero", row=row, col=1)
    fig.update_xaxes(title_text="time (s)", row=len(titles), col=1)
    fig.update_layout(title="Throughput and telemetry over time", height=260 * len(titles))
    return fig


def _latency_table(summary: dict[str, Any]) -> str:
    """Every latency distribution the run has, a row each, in ms, mean beside percentiles."""
    rows = []
    queued = bool((summary.get("queue_s") or {}).get("max"))
    for key, label in distributions().items():
        d = summary.get(key)
        if not d or not d.get("count") or ("queue" in key and not queued):
            continue
        rows.append({"latency": label} | {f"{s} (ms)": ms(d.get(s)) for s in STATS})
    return pd.DataFrame(rows).to_html(index=False) if rows else ""


def _class_table(summary: dict[str, Any]) -> str:
    """A row per traffic class: its counts, throughput, goodput and latency p50/p99 in ms."""
    rows = []
    for name, c in (summary.get("classes") or {}).items():
        row = {"class": name, "completed": c["completed"], "failed": c["failed"]}
        row |= {"req/s": c["request_throughput"], "output tok/s": c["output_throughput"]}
        row["goodput (req/s)"] = c.get("goodput")
        for key in ("ttft_s", "itl_s", "tpot_s", "e2e_s"):
            label = distributions()[key].split()[0]
            row |= {f"{label} {s} (ms)": ms(c[key].get(s)) for s in ("p50", "p99")}
        rows.append(row)
    if not rows:
        return ""
    return "<h3>By traffic class</h3>" + pd.DataFrame(rows).to_html(
        index=False, float_format=number, na_rep="-"
    )


def describe_run(summary: dict[str, Any], name: str) -> str:
    """What ran, in words: "poisson 4 req/s · 100 requests after 2 warm-up · ...", read from
    the config the run wrote."""
    cfg = summary.get("config", {})
    run, target, engine = cfg.get("run", {}), cfg.get("target", {}), cfg.get("engine") or {}
    # bench run writes the load in words (run/execute.py: _load_text); older folders: the rate
    rate = f"{float(run['rate']):g} req/s" if run.get("rate") is not None else "arrivals"
    load = cfg.get("load") or f"{run.get('arrival', '?')} {rate}"
    classes = run.get("classes") or []
    count = sum(c.get("num_requests") or 0 for c in classes) or run.get("num_requests")
    if count:
        amount = f"{count} requests"
        amount += f" after {run['warmup']} warm-up" if run.get("warmup") else ""
    else:
        amount = f"{run['duration']:g} s" if run.get("duration") else ""
    if run.get("dataset"):
        lengths = f"dataset {Path(run['dataset']).name}"
    elif classes or run.get("input_len") is None:  # each class's own, or a trace's
        lengths = ""
    else:
        lengths = f"input {run['input_len']} tokens, output {run.get('output_len') or 128}"
    kind = target.get("kind", "")
    if kind.startswith("bundled"):
        sched = engine.get("scheduler", {})
        what = f"bundled {engine.get('model') or run.get('model')}"
        what += f" ({engine.get('dtype', '?')}, {sched.get('batching', '?')} batching"
        what += f", max {sched.get('max_num_seqs', '?')} sequences)"
        what += " in process" if kind.endswith("in-process") else ""
    elif kind == "simulated":
        what = sim_title(engine, run.get("model"))
    else:
        what = f"{run.get('model') or 'served model'} at {target.get('base_url', '?')}"
    parts = [run.get("name", name), load, amount, lengths, what]
    return " · ".join(str(p) for p in parts if p)


def run_report(run: Path, embed: bool = True, records: list[RequestRecord] | None = None) -> Path:
    """records: the run's measured ones, where the caller holds them (an hour of simulated
    traffic is ~10 s of reading back); else requests.jsonl's."""
    summary = json.loads((run / "summary.json").read_text())
    if records is None:
        records = read_records(run / "requests.jsonl")
    timeline = pd.read_csv(run / "timeline.csv") if (run / "timeline.csv").is_file() else None
    ok = finished(records)
    chunks = TokenTimes.of(ok)  # an hour's 46 M token times: gathered once for two figures
    itl = chunks.gaps(ok)
    throughput = throughput_figure(records, timeline, chunks)
    del chunks  # 8 bytes a token: not held while the latency CDFs sort their copies
    figs = [latency_figure(records, itl), timeline_figure(records), throughput]
    figs = [f for f in figs if has_data(f)]
    steps_file = run / "steps.jsonl"
    peak = summary.get("config", {}).get("device_peak")
    utilization = ""
    if steps_file.is_file() and steps_file.stat().st_size:
        steps = pd.read_json(steps_file, lines=True)
        figs.append(steps_figure(steps, summary.get("clock_t0", 0), peak))
        utilization = utilization_text(steps, peak)
    head = {label: summary.get(key) for key, label in RUN_HEADLINE}
    table = pd.DataFrame([head]).to_html(index=False, float_format=number, na_rep="-")
    table += _latency_table(summary) + _class_table(summary) + worker_table_html(summary)
    warnings = "".join(f"<li>{html.escape(w)}</li>" for w in summary.get("warnings", []))
    intro = html.escape(describe_run(summary, run.name))
    if utilization:
        intro += f"<p>{html.escape(utilization)}</p>"
    intro = _notices_html(summary) + intro
    title = f"servebench run {run.name}"
    if summary.get("config", {}).get("target", {}).get("kind") == "simulated":
        title += " (SIMULATED)"
        intro = SIMULATED_BANNER + intro
    out = run / "report.html"
    out.write_text(page(title, intro + f"<ul>{warnings}</ul>", figs, table, embed))
    return out


def _notices_html(summary: dict[str, Any]) -> str:
    """What the terminal said before the numbers (bench_cli/outcome.py), above them."""
    from bench_cli.outcome import notices

    out = ""
    for n in notices(summary):
        colour = "#f8d7da;border:1px solid #c00" if n.severity == "error" else "#fff3cd"
        out += (
            f"<p class='notice' style='background:{colour};padding:8px'><b>"
            f"{html.escape(n.label)}:</b> {html.escape(n.text)}</p>"
        )
    return out


RUN_HEADLINE = (
    ("completed", "completed"),
    ("failed", "failed"),
    ("duration_s", "duration (s)"),
    ("request_throughput", "req/s"),
    ("output_throughput", "output tok/s"),
    ("goodput", "goodput (req/s)"),
    ("valid", "valid"),
)
