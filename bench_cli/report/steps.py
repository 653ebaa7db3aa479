"""The engine steps figure (what each step computed, its time, KV blocks, achieved FLOP/s and
bytes/s) and the utilization line, from a run's steps.jsonl."""

from __future__ import annotations

from typing import Any

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from bench_cli.report.page import Figure

# Steps drawn at most (a simulated hour logs millions); the utilization line uses every one.
STEPS_DRAWN = 20000


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
