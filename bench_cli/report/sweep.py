"""A sweep's report.html (throughput-latency curves, goodput and latencies against the load,
settings side by side, latency against a numeric setting, the table of points) and
pareto.html (`bench report --pareto`), from sweep.csv and sweep.json."""

from __future__ import annotations

import html
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from bench_cli.report.page import (
    SIMULATED_BANNER,
    Figure,
    ms,
    number,
    page,
    setting_colours,
    setting_labels,
)
from bench_cli.sweep.grid import grid
from bench_cli.sweep.pareto import frontier_html, frontier_rows, pareto_figure
from bench_cli.sweep.table import INVALID_TEXT, invalid
from bench_cli.sweep.verdict import slo_of, verdict_html
from loadgen.metric_registry import distributions


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
        title_text=key, type="log", tickvals=ticks, ticktext=[number(t) for t in ticks]
    )
    fig.update_layout(title=f"Latency against {key} (dashed: points without one)", height=450)
    return fig


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
                cells = [_cell(r, f"{key}.{stat}", ms) for _, r in table.iterrows()]
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
    out.write_text(page(title, intro, figs, table_html, embed))
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
    out.write_text(page(f"Pareto view: {sweep.name}", intro, [fig], frontier_html(rows), embed))
    return out
