"""What `bench claims` shows: a table in the terminal (claim, the brief says, measured, verdict)
and claims.html, one page with each claim's evidence drawn, offline."""

from __future__ import annotations

import html
import time
from pathlib import Path
from typing import Any

import plotly.graph_objects as go
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from bench_cli.claims.claim import Claim, Scale, Simulation, models_run
from bench_cli.claims.verdict import FAILS, HOLDS, PARTLY, Finding

STYLES = {HOLDS: "green", PARTLY: "yellow", FAILS: "red"}
COLOURS = {HOLDS: "#1a7f37", PARTLY: "#9a6700", FAILS: "#cf222e"}


def print_table(
    console: Console,
    claims: list[Claim],
    findings: dict[str, Finding],
    scale: Scale,
    env: dict[str, Any],
) -> None:
    models = models_run(claims, scale)
    title = f"Claims measured here ({models}{', quick' if scale.quick else ''})"
    if scale.sim is not None:
        quick = ", quick" if scale.quick else ""
        title = (
            f"Claims SIMULATED on {scale.sim.where} ({models}{quick}; arrival rates "
            f"x {scale.sim.rate_factor:g}): predictions, not measurements"
        )
    table = Table(title=title, caption=escape(machine(env)), show_lines=True)
    said = "measured here" if scale.sim is None else "predicted"
    for name, ratio in (("claim", 1), ("the brief says", 3), (said, 4), ("verdict", 1)):
        table.add_column(name, ratio=ratio, overflow="fold")
    for c in claims:
        f = findings.get(c.id)
        verdict = "not run" if f is None else f.verdict
        style = STYLES.get(verdict, "dim")
        measured = "-" if f is None else f.measured if f.measured != "-" else f.why
        table.add_row(
            escape(f"{c.id} {c.title}"),
            escape(c.brief),
            escape(measured),
            f"[{style}]{escape(verdict)}[/]",
        )
    console.print(table)
    if scale.quick:
        console.print(
            "quick: a tiny random model and small loads test the machinery; its verdicts are "
            "not evidence about real serving (run without --quick)",
            highlight=False,
        )


def write_html(
    folder: Path, claims: list[Claim], findings: dict[str, Finding], record: dict[str, Any]
) -> Path:
    sections, first = [], True
    for c in claims:
        f = findings.get(c.id)
        verdict = "not run" if f is None else f.verdict
        colour = COLOURS.get(verdict, "#57606a")
        body = [
            f"<h2>{html.escape(f'{c.id}. {c.title}')} <span style='color:{colour}'>"
            f"{html.escape(verdict)}</span></h2>",
            f"<blockquote>{html.escape(c.brief)}</blockquote>",
        ]
        if f is not None:
            body.append(_parts_table(f))
            body.append(f"<p>{html.escape(f.why)}</p>")
            for spec in f.charts:
                fig = _figure(spec)
                body.append(fig.to_html(full_html=False, include_plotlyjs=first))
                first = False
        body.append(f"<p class='dim'>folder: {html.escape(f'{c.id}-{c.slug}/')}</p>")
        sections.append("<section>" + "".join(body) + "</section>")
    stamp = machine(record.get("environment") or {})
    sim = record.get("simulation")  # which claims ran (7d only simulated) and on what model
    ran = Scale(
        record["quick"], record["model"], record["base_url"], Simulation(**sim) if sim else None
    )
    quick = " (quick: tiny random model, not evidence)" if record["quick"] else ""
    scale = f"{models_run(claims, ran)}{quick}"
    heading, banner = "The serving claims, measured here", ""
    if sim:
        tp = sim.get("tensor_parallel_size", 1)
        where = f"{tp} x {sim['device']}" if tp > 1 else sim["device"]
        heading = f"The serving claims, SIMULATED on {where}"
        cost = sim.get("cost_model") or "calibrated where a profile is found, else roofline"
        banner = (
            "<p style='background:#fff8c5;border:1px solid #d4a72c;padding:8px'><b>SIMULATED"
            f"</b>: the engine's scheduler on a virtual clock, steps timed by a cost model "
            f"({html.escape(cost)}); arrival rates x {sim['rate_factor']:g}. Predictions, "
            "not measurements.</p>"
        )
    out = folder / "claims.html"
    out.write_text(
        "<!doctype html><html><head><meta charset='utf-8'><title>servebench claims</title>"
        "<style>body{font-family:sans-serif;margin:24px;max-width:1100px}"
        "table{border-collapse:collapse;font-size:13px}td,th{border:1px solid #ccc;"
        "padding:3px 8px}blockquote{color:#444;border-left:3px solid #ccc;margin:0;"
        "padding-left:10px}.dim{color:#777;font-size:12px}section{margin-bottom:36px}</style>"
        f"</head><body><h1>{heading}</h1>{banner}"
        f"<p>Model {html.escape(scale)}. Thresholds fixed before the run (claims.json). "
        f"Machine: {html.escape(stamp)}</p>{''.join(sections)}</body></html>"
    )
    return out


def machine(env: dict[str, Any]) -> str:
    """The environment stamp in words: where these numbers come from."""
    hw, versions = env.get("hardware") or {}, env.get("versions") or {}
    gpus = ", ".join(g["name"] for g in hw.get("gpus") or []) or "no GPU"
    when = time.strftime("%Y-%m-%d %H:%M", time.gmtime(env.get("created_at") or 0))
    return (
        f"{hw.get('cpu')} ({hw.get('cpu_count')} cores, {hw.get('memory_gb')} GiB), {gpus}; "
        f"{hw.get('platform')}; Python {env.get('python')}, torch {versions.get('torch')}; "
        f"servebench {str(env.get('git_commit'))[:10]}; {when} UTC"
    )


def _parts_table(f: Finding) -> str:
    if not f.parts:
        return ""
    rows = "".join(
        f"<tr><td>{html.escape(p.what)}</td><td>{html.escape(p.measured)}</td>"
        f"<td>{html.escape(p.threshold)}</td><td style='color:{COLOURS.get(p.verdict, '#57606a')}'>"
        f"{html.escape(p.verdict)}</td></tr>"
        for p in f.parts
    )
    head = "<tr><th>part</th><th>measured</th><th>holds at</th><th>verdict</th></tr>"
    return f"<table>{head}{rows}</table>"


def _figure(spec: dict[str, Any]) -> go.Figure:
    fig = go.Figure()
    for name, values in spec["series"].items():
        if spec["kind"] == "line":
            fig.add_trace(go.Scatter(x=spec["x"], y=values, name=name, mode="lines+markers"))
        else:
            fig.add_trace(go.Bar(x=spec["x"], y=values, name=name))
    fig.update_layout(
        title=spec["title"],
        yaxis_title=spec["y"],
        height=340,
        barmode="group",
        margin={"t": 50, "b": 40},
        showlegend=len(spec["series"]) > 1,
    )
    return fig
