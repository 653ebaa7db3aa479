"""One self-contained HTML report per run or sweep (plotly), rebuilt from the files on disk
alone (`bench report DIR`): a run's latency CDFs, request timeline, throughput and telemetry
over time and its engine steps; a sweep's throughput-latency curves and goodput per load."""

from __future__ import annotations

import html
import json
import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.colors import qualitative
from plotly.subplots import make_subplots

from bench_cli.signals import signal
from bench_cli.sweep.grid import grid
from bench_cli.sweep.pareto import frontier_html, frontier_rows, pareto_figure
from bench_cli.sweep.table import INVALID_TEXT, invalid
from bench_cli.sweep.verdict import slo_of, verdict_html
from bench_cli.tables import sim_title
from bench_cli.worker_view import worker_table_html
from loadgen.metric_registry import distributions
from loadgen.metrics import STATS, Latencies
from loadgen.records import RequestRecord, TokenTimes, read_records

Figure = go.Figure
# What one figure draws at most (a simulated hour has 360,000 requests and millions of token
# gaps): CDF points, requests drawn as lines, steps drawn. Summaries use every value.
CDF_POINTS, TIMELINE_REQUESTS, STEPS_DRAWN = 4000, 2000, 20000
LATENCY_TITLES = {"TTFT": "TTFT", "ITL": "ITL", "TPOT": "TPOT", "E2E": "E2E latency"}
# Plotly's own formats print 2.11k or 2110.4999; a reader expects 2,110.
TICK_FORMAT, HOVER_FORMAT = ",~f", ",.6~g"


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


def steps_figure(steps: pd.DataFrame, t0: float, peak: dict[str, Any] | None = None) -> Figure:
    """What each engine step computed: prefill and decode tokens, its time, KV blocks, and (in
    step logs that count them, engine/model/cost.py) its achieved model FLOP/s and bytes/s
    against this device's measured peak (bench_cli/device_peak.py)."""
    stride = -(-len(steps) // STEPS_DRAWN)
    steps = steps.iloc[::stride]
    t = steps["t"] - t0
    moved = _bytes_moved(steps)
    titles = ["tokens per step", "step time (ms)", "KV blocks used"]
    if moved is not None:
        titles += ["achieved GFLOP/s (model FLOPs)", "achieved GB/s (weights + KV read + written)"]
    fig = make_subplots(rows=len(titles), cols=1, shared_xaxes=True, subplot_titles=titles)
    fig.add_trace(go.Bar(x=t, y=steps["prefill_tokens"], name="prefill"), row=1, col=1)
    fig.add_trace(go.Bar(x=t, y=steps["decode_tokens"], name="decode"), row=1, col=1)
    fig.add_trace(
        go.Scatter(
            x=t, y=steps["dur_s"] * 1e3, mode="markers", name="step time", marker={"size": 3}
        ),
        row=2,
        col=1,
    )
    fig.add_trace(
        go.Scatter(x=t, y=steps["kv_blocks_used"], mode="lines", name="KV blocks"), row=3, col=1
    )
    if moved is not None:
        kind = steps["prefill_tokens"].gt(0).map({True: "steps with prefill", False: "decode"})
        for row, values in ((4, steps["flops"]), (5, moved)):
            for name in ("decode", "steps with prefill"):
                sel = kind == name
                fig.add_trace(
                    go.Scatter(
                        x=t[sel], y=values[sel] / steps["dur_s"][sel] / 1e9, mode="markers",
                        name=f"{name} ({'FLOP/s' if row == 4 else 'bytes/s'})",
                        marker={"size": 3},
                    ),
                    row=row,
                    col=1,
                )  # fmt: skip
        if peak:
            lines = ((4, peak["peak_flops"], "matmul peak"),
                     (5, peak["peak_read_bytes_per_s"], "read peak"))  # fmt: skip
            for row, value, label in lines:
                fig.add_hline(
                    y=value / 1e9, line_dash="dash", annotation_text=f"{label} {value / 1e9:.0f}",
                    row=row, col=1,
                )  # fmt: skip
    fig.update_layout(
        barmode="stack",
        title="Engine steps (t=0: the first scheduled send)"
        + (f": every {stride}th step drawn" if stride > 1 else ""),
        height=250 * len(titles),
    )
    fig.update_xaxes(title_text="time (s)", row=len(titles), col=1)
    return fig


def _bytes_moved(steps: pd.DataFrame) -> pd.Series | None:
    """Each step's bytes moved, where the step log counts them (engine/model/cost.py; with its
    "flops"); None for older logs."""
    if "flops" not in steps or not steps["flops"].notna().any():
        return None
    return steps["weight_bytes"] + steps["kv_read_bytes"] + steps["kv_write_bytes"]


def utilization_text(steps: pd.DataFrame, peak: dict[str, Any] | None) -> str:
    """Time-weighted achieved rates of decode steps and of steps with prefill (total FLOPs or
    bytes / total step time), as a share of the peak where it was measured."""
    moved = _bytes_moved(steps)
    if moved is None:
        return ""
    parts = []
    for name, sel in (("decode steps", steps["prefill_tokens"].eq(0)),
                      ("steps with prefill", steps["prefill_tokens"].gt(0))):  # fmt: skip
        time_s = steps["dur_s"][sel].sum()
        if not sel.any() or time_s <= 0:
            continue
        flops, bw = steps["flops"][sel].sum() / time_s, moved[sel].sum() / time_s
        text = f"{name}: {flops / 1e9:.1f} GFLOP/s, {bw / 1e9:.1f} GB/s"
        if peak:
            text += (
                f" ({flops / peak['peak_flops']:.0%} of matmul peak, "
                f"{bw / peak['peak_read_bytes_per_s']:.0%} of read bandwidth)"
            )
        parts.append(text)
    if not parts:
        return ""
    where = "against peaks measured on this machine" if peak else "no device peak recorded"
    if peak and str(peak.get("device", "")).startswith("simulated"):
        where = f"against the {peak['device']}'s peaks ({peak.get('source') or 'its spec'})"
    return f"Engine utilization ({where}): " + "; ".join(parts) + "."


PALETTE = tuple(dict.fromkeys(qualitative.Plotly + qualitative.Dark24))


def setting_colours(labels: Iterable[object]) -> dict[str, str]:
    """A fixed colour per setting label, by first appearance: every panel of a sweep draws a
    setting in the same colour, so one legend reads for all of them."""
    names = list(dict.fromkeys(str(x) for x in labels))
    return {name: PALETTE[i % len(PALETTE)] for i, name in enumerate(names)}


def setting_labels(table: pd.DataFrame, axes: list[str], load: str | None) -> pd.Series:
    """Each point's setting: its axes' values less the load's."""
    settings = [a for a in axes if a != load]
    if not settings:
        return table["point"].astype(str)
    return table[settings].astype(str).agg(" ".join, axis=1)


def sweep_figures(
    table: pd.DataFrame, axes: list[str], load: str | None, setting_keys: Sequence[str] = ()
) -> list[Figure]:
    label = setting_labels(table, axes, load)
    table = table.copy().assign(setting=label)  # read_csv of a wide table is fragmented
    colours = setting_colours(table["setting"])
    figs = []
    fig = go.Figure()
    for name, g in table.groupby("setting", sort=False):
        fig.add_trace(
            go.Scatter(
                x=g["output_throughput"],
                y=g["tpot_s.p99"] * 1e3,
                mode="lines+markers",
                name=str(name),
                legendgroup=str(name),
                line={"color": colours[str(name)]},
                marker={"symbol": _symbols(g), "size": 9},
                text=[f"{load}={v}" for v in g[load]] if load else None,
            )
        )
    fig.update_layout(
        title="Throughput vs latency (each point a load; x: INVALID, schedule not kept)",
        xaxis_title="output tokens/s",
        yaxis_title="TPOT p99 (ms)",
        xaxis_rangemode="tozero",  # from 0: no zoom that makes noise look like a difference
        yaxis_rangemode="tozero",
        height=450,
    )
    figs.append(fig)
    figs.append(pareto_figure(table, colours, load))
    if load:
        figs.append(_against_load(table, load, colours))
    figs.append(_side_by_side(table, load, colours))
    for key in setting_keys:
        numeric = pd.to_numeric(table.get(key), errors="coerce")
        if key != load and numeric.notna().any() and numeric.nunique() > 1:
            figs.append(_latency_against(table.assign(_x=numeric), key, load, colours))
    return figs


def _symbols(rows: pd.DataFrame) -> list[str]:
    """An INVALID point (schedule not kept) drawn as an x, so no plot shows it as a result."""
    return ["x" if invalid(r) else "circle" for r in rows.to_dict("records")]


def _against_load(table: pd.DataFrame, load: str, colours: dict[str, str]) -> Figure:
    """Goodput and p99 latencies against the load, a line per setting."""
    fig = make_subplots(rows=1, cols=3, subplot_titles=("goodput", "TTFT p99 (ms)", "ITL p99 (ms)"))
    for name, g in table.groupby("setting", sort=False):
        for col, key, scale in ((1, "goodput", 1), (2, "ttft_s.p99", 1e3), (3, "itl_s.p99", 1e3)):
            if key in g and g[key].notna().any():
                fig.add_trace(
                    go.Scatter(
                        x=g[load],
                        y=g[key] * scale,
                        mode="lines+markers",
                        name=str(name),
                        legendgroup=str(name),
                        showlegend=col == 1,
                        line={"color": colours[str(name)]},
                        marker={"symbol": _symbols(g), "size": 9},
                    ),
                    row=1,
                    col=col,
                )
    fig.update_xaxes(title_text=load)
    fig.update_yaxes(rangemode="tozero")  # from 0: a small difference looks small
    fig.update_layout(title=f"Against {load}", height=450)
    return fig


SIDE_BY_SIDE = (
    ("output_throughput", "output tok/s", 1.0),
    ("ttft_s.p99", "TTFT p99 (ms)", 1e3),
    ("tpot_s.p99", "TPOT p99 (ms)", 1e3),
    ("telemetry.mean_engine_running", "mean sequences running", 1.0),
)


_ONE_RUN = "one run each: no noise estimate, --repeat 3 gives one"


def _repeated(table: pd.DataFrame) -> bool:
    return any(c.endswith(".ci95") for c in table.columns)


def _spread(g: pd.DataFrame, key: str, scale: float) -> dict[str, Any] | None:
    """Error bars of a repeated sweep's 95 % confidence half-width."""
    if f"{key}.ci95" not in g:
        return None
    return {"type": "data", "array": list(g[f"{key}.ci95"] * scale), "visible": True}


def _side_by_side(table: pd.DataFrame, load: str | None, colours: dict[str, str]) -> Figure:
    """Bars: each setting's headline numbers next to each other, a bar group per load and a
    bar colour per setting (the colour it has in every other panel)."""
    panels = [(k, t, f) for k, t, f in SIDE_BY_SIDE if k in table and table[k].notna().any()]
    fig = make_subplots(rows=1, cols=len(panels), subplot_titles=[t for _, t, _ in panels])
    for name, g in table.groupby("setting", sort=False):
        x = [f"{load}={v}" for v in g[load]] if load else ["all"] * len(g)
        for col, (key, _, scale) in enumerate(panels, start=1):
            fig.add_trace(
                go.Bar(
                    x=x,
                    y=g[key] * scale,
                    name=str(name),
                    legendgroup=str(name),
                    showlegend=col == 1,
                    marker={"color": colours[str(name)]},
                    error_y=_spread(g, key, scale),
                ),
                row=1,
                col=col,
            )
    # bars from 0, never zoomed in: a noise-sized difference must look noise-sized
    spread = "whiskers: 95 % CI of the repeats" if _repeated(table) else _ONE_RUN
    fig.update_layout(title=f"Settings side by side ({spread})", barmode="group", height=400)
    return fig


LOAD_GREYS = ("#444444", "#888888", "#bbbbbb", "#222222", "#666666", "#aaaaaa")


def _latency_against(
    table: pd.DataFrame, key: str, load: str | None, colours: dict[str, str]
) -> Figure:
    """p99 TTFT/ITL/TPOT against a numeric setting (chunk size, say): a grey line per load
    through points in their setting's colour. Settings without a value for it (a bundle such
    as "no chunking") are dashed reference lines in theirs."""
    panels = (("ttft_s.p99", "TTFT p99 (ms)"), ("itl_s.p99", "ITL p99 (ms)"))
    panels += (("tpot_s.p99", "TPOT p99 (ms)"),)
    fig = make_subplots(rows=1, cols=3, subplot_titles=[t for _, t in panels])
    groups = table.groupby(load, sort=False) if load else [("all", table)]
    for i, (value, g) in enumerate(groups):
        grey, name = LOAD_GREYS[i % len(LOAD_GREYS)], f"{load}={value}" if load else "all"
        line, refs = g[g["_x"].notna()].sort_values("_x"), g[g["_x"].isna()]
        for col, (metric, _) in enumerate(panels, start=1):
            if metric not in g:
                continue
            fig.add_trace(
                go.Scatter(
                    x=line["_x"],
                    y=line[metric] * 1e3,
                    mode="lines+markers",
                    name=name,
                    legendgroup=name,
                    showlegend=col == 1,
                    line={"color": grey},
                    marker={"color": [colours[s] for s in line["setting"]], "size": 9},
                    text=list(line["setting"]),
                ),
                row=1,
                col=col,
            )
            for _, ref in refs.iterrows():
                fig.add_hline(
                    y=ref[metric] * 1e3,
                    line={"color": colours[ref["setting"]], "dash": "dash"},
                    annotation_text=f"{ref['setting']} ({name})",
                    row=1,
                    col=col,
                )
    for name, colour in colours.items():  # the settings' legend, as in the other panels
        fig.add_trace(
            go.Scatter(
                x=[None],
                y=[None],
                mode="markers",
                name=name,
                legendgroup=name,
                marker={"color": colour, "size": 9},
            ),
            row=1,
            col=1,
        )
    ticks = sorted(table["_x"].dropna().unique())  # plotly's own log ticks read "5 100 2 5"
    fig.update_xaxes(
        title_text=key, type="log", tickvals=ticks, ticktext=[_number(t) for t in ticks]
    )
    fig.update_layout(title=f"Latency against {key} (dashed: points without one)", height=450)
    return fig


def _number(v: float) -> str:
    """Thousands whole with commas (2,110 tok/s, not 2.11e+03), whole numbers as such,
    others to 3 figures; never "-0"."""
    if 1000 <= abs(v) < 1e15:
        return f"{v:,.0f}"
    return f"{v:z.0f}" if float(v).is_integer() else f"{v:z.3g}"  # z: no "-0"


def has_data(fig: Figure) -> bool:
    """Some trace has a point: a figure without one is an empty frame, left out."""
    return any(len(t.x if t.x is not None else ()) for t in fig.data)


def _page(title: str, intro: str, figs: list[Figure], table_html: str, embed: bool) -> str:
    parts = []
    for i, fig in enumerate(figs):
        fig.update_xaxes(tickformat=TICK_FORMAT, hoverformat=HOVER_FORMAT)
        fig.update_yaxes(tickformat=TICK_FORMAT, hoverformat=HOVER_FORMAT)
        js: Any = (True if embed else "cdn") if i == 0 else False
        parts.append(fig.to_html(full_html=False, include_plotlyjs=js))
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
        "<style>body{font-family:sans-serif;margin:24px;max-width:1200px}"
        "table{border-collapse:collapse;font-size:13px}td,th{border:1px solid #ccc;"
        "padding:3px 8px;text-align:right}.wide{overflow-x:auto}</style></head><body>"
        f"<h1>{html.escape(title)}</h1><p>{intro}</p><div class='wide'>{table_html}</div>"
        f"{''.join(parts)}</body></html>"
    )


def _ms(seconds: float | None) -> str:
    if seconds is None or pd.isna(seconds):
        return "-"
    ms = seconds * 1e3
    # z, as bench_cli/tables.py: a float's dust below zero (a schedule lag) is 0.00, not -0.00
    return f"{ms:z.2f}" if ms < 10 else f"{ms:z.1f}" if ms < 1000 else f"{ms:,.0f}"


def _latency_table(summary: dict[str, Any]) -> str:
    """Every latency distribution the run has, a row each, in ms, mean beside percentiles."""
    rows = []
    queued = bool((summary.get("queue_s") or {}).get("max"))
    for key, label in distributions().items():
        d = summary.get(key)
        if not d or not d.get("count") or ("queue" in key and not queued):
            continue
        rows.append({"latency": label} | {f"{s} (ms)": _ms(d.get(s)) for s in STATS})
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
            row |= {f"{label} {s} (ms)": _ms(c[key].get(s)) for s in ("p50", "p99")}
        rows.append(row)
    if not rows:
        return ""
    return "<h3>By traffic class</h3>" + pd.DataFrame(rows).to_html(
        index=False, float_format=_number, na_rep="-"
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
    table = pd.DataFrame([head]).to_html(index=False, float_format=_number, na_rep="-")
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
    out.write_text(_page(title, intro + f"<ul>{warnings}</ul>", figs, table, embed))
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


SIMULATED_BANNER = (
    "<p style='background:#fff3cd;border:1px solid #e0b800;padding:8px'><b>SIMULATED:</b> "
    "no model ran. The engine's scheduler and KV cache ran on a virtual clock and each step "
    "took the time its cost model gives (config.json: engine.sim).</p>"
)
RUN_HEADLINE = (
    ("completed", "completed"),
    ("failed", "failed"),
    ("duration_s", "duration (s)"),
    ("request_throughput", "req/s"),
    ("output_throughput", "output tok/s"),
    ("goodput", "goodput (req/s)"),
    ("valid", "valid"),
)
# sweep.csv columns the sweep's table shows (latencies come after, in ms)
SWEEP_HEADLINE = (
    ("simulated", "simulated", "{:.0f}"),
    ("runs", "runs", "{:.0f}"),
    ("completed", "completed", "{:.0f}"),
    ("failed", "failed", "{:.0f}"),
    ("request_throughput", "req/s", "{:.2f}"),
    ("output_throughput", "output tok/s", "{:.1f}"),
    ("goodput", "goodput (req/s)", "{:.2f}"),
    ("slo_attainment", "in SLO", "{:.0%}"),
    ("telemetry.mean_engine_running", "mean running", "{:.1f}"),
    ("telemetry.preemptions", "preempted", "{:.0f}"),
    ("telemetry.peak_server_rss_mb", "peak server RSS (MB)", "{:.0f}"),
    ("telemetry.mean_server_cpu_percent", "server CPU % (mean; 100 = one core)", "{:.0f}"),
)
SWEEP_LATENCIES = ("ttft_s", "itl_s", "tpot_s", "e2e_s")


def _cell(row: pd.Series, key: str, fmt: Any) -> str:
    """A value with its 95 % confidence half-width when the point was repeated."""
    value, ci = row.get(key), row.get(f"{key}.ci95")
    if value is None or pd.isna(value):
        return "-"
    text = fmt(value)
    return text if ci is None or pd.isna(ci) else f"{text} ±{fmt(ci)}"


def _validity(row: pd.Series) -> str:
    if not invalid(row.to_dict()):
        return "yes"
    bad, runs = row.get("invalid_runs"), row.get("runs")
    if pd.notna(bad) and pd.notna(runs) and runs > 1:
        return f"INVALID ({bad:.0f} of {runs:.0f} runs)"
    return "INVALID"


def sweep_table_html(table: pd.DataFrame, axes: list[str], slo: str | None = None) -> str:
    """One row per point: its settings, throughput, then TTFT/ITL/TPOT/E2E mean, p50 and p99,
    all in ms like the plots beside it (a header row per distribution keeps it narrow)."""
    cols: dict[tuple[str, str], list[str]] = {}
    for a in axes:
        if a in table:
            cols[("", a)] = list(table[a].astype(str))
    for key, label, fmt in SWEEP_HEADLINE:
        if key == "simulated" and key in table and not table[key].fillna(0).any():
            continue  # a real sweep: no column saying so
        if key in table and table[key].notna().any():
            if key == "slo_attainment":  # never an "in SLO" without the SLO it means
                label = f"in SLO ({slo})" if slo else label
            cols[("", label)] = [_cell(r, key, fmt.format) for _, r in table.iterrows()]
    if any(invalid(r) for _, r in table.iterrows()):
        cols[("", "valid")] = [_validity(r) for _, r in table.iterrows()]
    for key in SWEEP_LATENCIES:
        for stat in ("mean", "p50", "p99"):
            if f"{key}.{stat}" in table:
                cells = [_cell(r, f"{key}.{stat}", _ms) for _, r in table.iterrows()]
                cols[(f"{distributions()[key]} (ms)", stat)] = cells
    return pd.DataFrame(cols).to_html(index=False)


def sweep_report(sweep: Path, embed: bool = True) -> Path:
    table = pd.read_csv(sweep / "sweep.csv")
    plan = json.loads((sweep / "sweep.json").read_text())
    plan_axes = plan.get("report_axes") or plan["axes"]  # --slo-search: the rates it tested
    axes = list(plan_axes)
    load = next((a for a in axes if a in ("rate", "concurrency")), None)
    setting_keys = list(dict.fromkeys(k for p in grid(plan_axes) for k in p.settings))
    figs = sweep_figures(table, axes, load, setting_keys)
    out = sweep / "report.html"
    intro = html.escape(f"{len(table)} points over {', '.join(axes)}; {plan['repeat']} run(s) each")
    title = f"servebench sweep {sweep.name}"
    simulated = table["simulated"].fillna(0) if "simulated" in table else pd.Series([0.0])
    if simulated.all():
        title, intro = title + " (SIMULATED)", SIMULATED_BANNER + intro
    elif simulated.any():
        title += " (partly SIMULATED)"
        intro = SIMULATED_BANNER.replace("no model ran", "points with simulated = 1: no model ran")
        intro += html.escape(f"{len(table)} points over {', '.join(axes)}")
    table_html = sweep_table_html(table, axes, slo_of(plan))
    bad = sum(invalid(r) for r in table.to_dict("records"))
    if bad:
        text = html.escape(INVALID_TEXT.format(bad, len(table))).replace(
            "INVALID points", "<b>INVALID points</b>"
        )
        intro = (
            f"<p style='background:#f8d7da;border:1px solid #c00;padding:8px'>{text}</p>" + intro
        )
    rows = table.to_dict("records")
    intro = verdict_html(rows, axes, load, plan) + intro  # the answer first
    out.write_text(_page(title, intro, figs, table_html, embed))
    return out


def pareto_report(sweep: Path, embed: bool = True) -> Path:
    """`bench report --pareto DIR`: the Pareto chart and the frontier's points, pareto.html."""
    table = pd.read_csv(sweep / "sweep.csv")
    plan = json.loads((sweep / "sweep.json").read_text())
    axes = list(plan.get("report_axes") or plan["axes"])
    load = next((a for a in axes if a in ("rate", "concurrency")), None)
    table = table.assign(setting=setting_labels(table, axes, load))
    fig = pareto_figure(table, setting_colours(table["setting"]), load)
    rows = frontier_rows(table, [a for a in axes if a in table])
    out = sweep / "pareto.html"
    intro = html.escape(f"{len(table)} points of sweep {sweep.name}")
    out.write_text(_page(f"Pareto view: {sweep.name}", intro, [fig], frontier_html(rows), embed))
    return out


def build_report(path: Path, embed: bool = True) -> Path:
    """A run folder or a sweep folder, told apart by what is in it."""
    if (path / "sweep.csv").is_file():
        return sweep_report(path, embed)
    if (path / "summary.json").is_file():
        return run_report(path, embed)
    raise ValueError(f"{path}: neither a run folder (summary.json) nor a sweep (sweep.csv)")
