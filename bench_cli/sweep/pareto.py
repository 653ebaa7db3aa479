"""The Pareto view of a sweep, as vLLM's `bench sweep plot_pareto` draws it: each point's
output tokens/s per user (1 / median TPOT: how fast one reader sees text) against output
tokens/s of the whole server, and the frontier of points no other point beats on both. A
setting off the frontier is never the one to pick, whatever the load it is meant for."""

from __future__ import annotations

import html
import math
from typing import Any

import pandas as pd
import plotly.graph_objects as go
from plotly.graph_objects import Figure

from bench_cli.sweep.table import invalid

X_TITLE = "output tok/s per user (1 / TPOT p50)"
Y_TITLE = "output tok/s (server)"


def frontier(points: list[tuple[float, float]]) -> list[int]:
    """Indices of the points no other point matches or beats on both coordinates (higher is
    better on both), in order of rising x; points with a missing coordinate never count."""
    usable = [i for i, (x, y) in enumerate(points) if math.isfinite(x) and math.isfinite(y)]
    best_y = -math.inf
    kept = []
    # x falling, ties broken by y falling: a point is on the frontier when it beats the best
    # y among the points of higher (or equal) x
    for i in sorted(usable, key=lambda i: (-points[i][0], -points[i][1])):
        if points[i][1] > best_y:
            kept.append(i)
            best_y = points[i][1]
    return sorted(kept, key=lambda i: points[i][0])


def pareto_points(table: pd.DataFrame) -> pd.DataFrame:
    """Per point: x, y and whether it is on the frontier (INVALID points never are: their
    numbers are of another load)."""
    tpot = pd.to_numeric(table.get("tpot_s.p50"), errors="coerce")
    out = table.assign(
        _x=1 / tpot.where(tpot > 0), _y=pd.to_numeric(table["output_throughput"], errors="coerce")
    )
    ok = [not invalid(r) for r in out.to_dict("records")]
    candidates = [
        (float(x), float(y)) if good else (math.nan, math.nan)
        for x, y, good in zip(
            out["_x"].fillna(math.nan), out["_y"].fillna(math.nan), ok, strict=True
        )
    ]
    on = set(frontier(candidates))
    return out.assign(_frontier=[i in on for i in range(len(out))], _valid=ok)


def pareto_figure(table: pd.DataFrame, colours: dict[str, str], load: str | None) -> Figure:
    """`table` with a "setting" column (report.sweep_figures adds it)."""
    points = pareto_points(table)
    fig = go.Figure()
    for name, g in points.groupby("setting", sort=False):
        fig.add_trace(
            go.Scatter(
                x=g["_x"],
                y=g["_y"],
                mode="markers",
                name=str(name),
                legendgroup=str(name),
                marker={
                    "color": colours[str(name)],
                    "size": 10,
                    "symbol": ["circle" if v else "x" for v in g["_valid"]],
                },
                text=[f"{name} {load}={v}" for v in g[load]] if load else [str(name)] * len(g),
            )
        )
    front = points[points["_frontier"]].sort_values("_x")
    fig.add_trace(
        go.Scatter(
            x=front["_x"],
            y=front["_y"],
            mode="lines",
            name="Pareto frontier",
            line={"color": "black", "dash": "dash", "shape": "hv"},
        )
    )
    fig.update_layout(
        title="Pareto: per-user speed against server throughput (dashed: the frontier; x: INVALID)",
        xaxis_title=X_TITLE,
        yaxis_title=Y_TITLE,
        xaxis_rangemode="tozero",
        yaxis_rangemode="tozero",
        height=450,
    )
    return fig


def frontier_rows(table: pd.DataFrame, settings: list[str]) -> list[dict[str, Any]]:
    """The frontier's points, slowest per user first: their settings and both numbers."""
    points = pareto_points(table)
    front = points[points["_frontier"]].sort_values("_x")
    return [
        {**{k: r[k] for k in settings}, "per_user": r["_x"], "server": r["_y"]}
        for r in front.to_dict("records")
    ]


def frontier_html(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return "<p>No valid point with a TPOT: no frontier.</p>"
    keys = list(rows[0])
    head = "".join(f"<th>{html.escape(k)}</th>" for k in keys)
    body = "".join(
        "<tr>"
        + "".join(
            f"<td>{v:.1f}</td>" if isinstance(v, float) else f"<td>{html.escape(str(v))}</td>"
            for v in r.values()
        )
        + "</tr>"
        for r in rows
    )
    return f"<h3>On the Pareto frontier</h3><table><tr>{head}</tr>{body}</table>"
