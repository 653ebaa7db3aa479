"""What every report page shares: the HTML page around the figures, number formats, and a
fixed colour per setting."""

from __future__ import annotations

import html
from collections.abc import Iterable
from typing import Any

import pandas as pd
import plotly.graph_objects as go
from plotly.colors import qualitative

Figure = go.Figure
# Plotly's own formats print 2.11k or 2110.4999; a reader expects 2,110.
TICK_FORMAT, HOVER_FORMAT = ",~f", ",.6~g"


def number(v: float) -> str:
    """Thousands whole with commas (2,110 tok/s, not 2.11e+03), whole numbers as such,
    others to 3 figures; never "-0"."""
    if 1000 <= abs(v) < 1e15:
        return f"{v:,.0f}"
    return f"{v:z.0f}" if float(v).is_integer() else f"{v:z.3g}"  # z: no "-0"


def has_data(fig: Figure) -> bool:
    """Some trace has a point: a figure without one is an empty frame, left out."""
    return any(len(t.x if t.x is not None else ()) for t in fig.data)


def page(title: str, intro: str, figs: list[Figure], table_html: str, embed: bool) -> str:
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


def ms(seconds: float | None) -> str:
    """Seconds as milliseconds, to 3 or 4 figures; "-" where there is no value."""
    if seconds is None or pd.isna(seconds):
        return "-"
    v = seconds * 1e3
    # z, as bench_cli/tables.py: a float's dust below zero (a schedule lag) is 0.00, not -0.00
    return f"{v:z.2f}" if v < 10 else f"{v:z.1f}" if v < 1000 else f"{v:,.0f}"


SIMULATED_BANNER = (
    "<p style='background:#fff3cd;border:1px solid #e0b800;padding:8px'><b>SIMULATED:</b> "
    "no model ran. The engine's scheduler and KV cache ran on a virtual clock and each step "
    "took the time its cost model gives (config.json: engine.sim).</p>"
)


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
