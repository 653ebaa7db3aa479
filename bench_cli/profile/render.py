"""`bench profile`'s table by category and the lines under it, beside an earlier profile
(--compare) where given."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rich.markup import escape
from rich.table import Table

from bench_cli.profile.capture import CATEGORIES, ProfileError


def load_report(path: str | Path) -> dict[str, Any]:
    """A profile.json, or the folder holding one (for --compare)."""
    path = Path(path)
    if path.is_dir():
        path = path / "profile.json"
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ProfileError(f"cannot read a profile from {path}: {e}") from None


def differences(report: dict[str, Any], before: dict[str, Any]) -> list[str]:
    """What differs between two profiles besides the code: shape, model and engine settings."""
    out = [
        f"{key}: {before['shape'][key]} before, {report['shape'][key]} now"
        for key in ("batch", "context", "prefill")
        if before["shape"].get(key) != report["shape"][key]
    ]
    for key in ("model", "dtype", "quantization", "enforce_eager"):
        old, new = before["engine"].get(key), report["engine"].get(key)
        if old != new:
            out.append(f"{key}: {old} before, {new} now")
    if before["peak"].get("threads") != report["peak"]["threads"]:
        out.append(
            f"threads: {before['peak'].get('threads')} before, {report['peak']['threads']} now"
        )
    return out


def render(report: dict[str, Any], before: dict[str, Any] | None = None) -> tuple[Table, list[str]]:
    """The table by category and the lines under it, from what `run_profile` stores; with
    `before` (an earlier profile), its times beside and the step's speed-up."""
    shape, peak, rates = report["shape"], report["peak"], report["analysis"]["rates"]
    total = sum(report["category_s"].values())  # the timed pass's mean step
    parts = [f"{shape['batch']} decodes at ~{shape['context']} tokens of context"] * bool(
        shape["batch"]
    ) + [f"a {shape['prefill']}-token prefill chunk"] * bool(shape["prefill"])
    title = f"one step: {' + '.join(parts)}, mean of {shape['steps']} steps"
    table = Table(title=title)
    for col in ("category", "ms/step", "% of step", "in torch ops ms", "Python & dispatch ms"):
        table.add_column(col, justify="left" if col == "category" else "right")
    table.add_column("GFLOP/s (% of matmul peak)", justify="right")
    table.add_column("GB/s (% of read peak)", justify="right")
    was = before["category_s"] if before else {}
    if before:
        table.add_column("before ms/step", justify="right")
    for category in CATEGORIES:
        took = report["category_s"][category]
        if not took and not was.get(category):
            continue  # not on this path (compiled decode steps have no separate attention)
        ops = min(report["ops_s"][category], took)
        rate = rates.get(category, {})
        flops, moved = rate.get("flops_per_s"), rate.get("bytes_per_s")
        table.add_row(
            category,
            f"{took * 1e3:.2f}",
            f"{100 * took / total:.1f}",
            f"{ops * 1e3:.2f}",
            f"{(took - ops) * 1e3:.2f}",
            f"{flops / 1e9:.1f} ({100 * flops / peak['peak_flops']:.0f} %)" if flops else "",
            f"{moved / 1e9:.1f} ({100 * moved / peak['peak_read_bytes_per_s']:.0f} %)"
            if moved
            else "",
            *([f"{was.get(category, 0.0) * 1e3:.2f}"] if before else []),
        )
    before_total = [f"{sum(was.values()) * 1e3:.2f}"] if before else []
    table.add_row("all", f"{total * 1e3:.2f}", "", "", "", "", "", *before_total)
    a = report["analysis"]
    lines = [
        f"step {report['step_s'] * 1e3:.1f} ms (median; with the category timers "
        f"{report['timed_step_s'] * 1e3:.1f} ms median, {total * 1e3:.1f} mean; "
        f"{report['profiled_step_s'] * 1e3:.1f} ms under the profiler)",
        f"memory floor: {a['floor_bytes'] / 2**20:.0f} MiB read per step (weights, KV) at "
        f"{peak['peak_read_bytes_per_s'] / 1e9:.1f} GB/s = {a['floor_s'] * 1e3:.1f} ms: "
        f"the step takes {a['floor_ratio']:.2f}x the floor",
        f"peaks measured now: matmul {peak['peak_flops'] / 1e9:.0f} GFLOP/s "
        f"({peak['dtype']}, n={peak['matmul_n']}), read {peak['peak_read_bytes_per_s'] / 1e9:.1f} "
        f"GB/s, copy {peak['peak_bytes_per_s'] / 1e9:.1f} GB/s (read + write), "
        f"{peak['threads']} threads",
    ]
    if before:
        was_step = before["step_s"]
        lines.insert(
            1,
            f"before: step {was_step * 1e3:.1f} ms (median), now {report['step_s'] * 1e3:.1f} ms: "
            f"{was_step / report['step_s']:.2f}x as fast (profiles of separate runs: on a busy "
            f"machine, compare several, or benchmarks/decode_paths.py for steps taken in turn)",
        )
        for diff in differences(report, before):
            lines.insert(2, f"[yellow]warning: the two profiles differ in more than the code: "
                         f"{escape(diff)}[/yellow]")  # fmt: skip
    return table, lines
