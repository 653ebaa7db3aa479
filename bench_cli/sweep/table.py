"""The sweep's closing table: per load point, every setting side by side with the best of
each column marked, then each setting's SLO knee (the highest load it still served)."""

from __future__ import annotations

import math
import numbers
from collections import defaultdict
from typing import Any

from rich.console import Console
from rich.table import Table

from bench_cli.sweep.rates import SYNC
from loadgen import metric_registry

# (column, sweep.csv key, scale, format); which way is better is the metric registry's
COLUMNS = (
    ("req/s", "request_throughput", 1.0, "{:.2f}"),
    ("out tok/s", "output_throughput", 1.0, "{:.1f}"),
    ("TTFT p99 ms", "ttft_s.p99", 1e3, "{:.0f}"),
    ("ITL p99 ms", "itl_s.p99", 1e3, "{:.1f}"),
    ("TPOT p99 ms", "tpot_s.p99", 1e3, "{:.1f}"),
    ("goodput", "goodput", 1.0, "{:.2f}"),
    ("in SLO", "slo_attainment", 100.0, "{:.0f}%"),
    ("mean running", "telemetry.mean_engine_running", 1.0, "{:.1f}"),
    ("preempted", "telemetry.preemptions", 1.0, "{:.0f}"),
    # what sharing saves: prompt tokens computed (not served by a prefix cache), KV held
    ("prefill tok", "prompt_tokens_computed", 1.0, "{:.0f}"),
    ("prefix hits", "telemetry.prefix_cache_hit_rate", 100.0, "{:.0f}%"),
    ("peak KV blocks", "telemetry.peak_engine_kv_blocks_used", 1.0, "{:.0f}"),
    # speculative decoding: accepted / draft tokens, tokens per verified draft
    ("accepted", "telemetry.spec_acceptance_rate", 100.0, "{:.0f}%"),
    ("tok/draft", "telemetry.spec_mean_acceptance_length", 1.0, "{:.2f}"),
)
# A load is "served" when 90 % of requests meet every SLO (DistServe); --slo-target sets it.
SLO_ATTAINMENT = 0.9


def print_comparison(
    console: Console,
    rows: list[dict[str, Any]],
    axes: list[str],
    load_axes: list[str],
    target: float = SLO_ATTAINMENT,
) -> None:
    settings = [a for a in axes if a not in load_axes]
    groups: dict[tuple, list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        groups[tuple(row[a] for a in load_axes)].append(row)
    for load, members in groups.items():
        title = ", ".join(f"{a}={v}" for a, v in zip(load_axes, load, strict=True)) or "all"
        sims = [bool(m.get("simulated")) for m in members]
        mark = " (SIMULATED)" if all(sims) else " (partly SIMULATED)" if any(sims) else ""
        cols = [c for c in COLUMNS if any(m.get(c[1]) is not None for m in members)]
        best = {key: _best(members, key, higher(key)) for _, key, _, _ in cols}
        labels, cells = [], []
        for m in members:
            labels.append(" ".join(str(m[a]) for a in settings) or str(m["point"]))
            cells.append([_cell(m, key, scale, fmt) for _, key, scale, fmt in cols])
        header = " ".join(settings) or "point"
        # widths that hold each column's cells whole (and its header's longest word): set,
        # so rich does not squeeze a cell to "12…"
        marks = [len(" INVALID") if invalid(m) else 0 for m in members]
        label_w = max([len(header), *(len(t) + k for t, k in zip(labels, marks, strict=True))])
        widths = [
            max([*(len(w) for w in name.split()), *(len(row[i]) for row in cells)])
            for i, (name, *_) in enumerate(cols)
        ]
        room = console.width - 4 - label_w
        full = [max(w, len(c[0])) for w, c in zip(widths, cols, strict=True)]
        if len(_fit(full, room)) == 1:  # headers on one line where everything fits so
            widths = full
        for part, group in enumerate(_fit(widths, room)):
            more = " (continued)" if part else ""
            table = Table(title=f"load: {title}{mark}{more}", title_justify="left")
            table.add_column(header, no_wrap=True)
            for i in group:
                table.add_column(cols[i][0], justify="right", width=widths[i])
            for m, label, row in zip(members, labels, cells, strict=True):
                styled = [
                    f"[bold green]{row[i]}[/]"
                    if len(members) > 1 and m is best[cols[i][1]]
                    else row[i]
                    for i in group
                ]
                table.add_row(label + (" [bold red]INVALID[/]" if invalid(m) else ""), *styled)
            console.print(table)
    if bad := [m for m in rows if invalid(m)]:
        console.print(f"[bold red]{INVALID_TEXT.format(len(bad), len(rows))}[/]")
    if load_axes and settings:
        _print_knees(console, rows, settings, load_axes[0], target)


def higher(key: str) -> bool:
    """Is more better, for a sweep.csv key (`ttft_s.p99`: its distribution's direction)?"""
    m = metric_registry.metric(key) or metric_registry.metric(key.partition(".")[0])
    if m is None or not m.sign:
        raise KeyError(f"{key!r}: no direction in loadgen/metric_registry.py")
    return m.sign > 0


def _cell(m: dict[str, Any], key: str, scale: float, fmt: str) -> str:
    value = m.get(key)
    text = "-" if value is None else fmt.format(value * scale)
    ci = m.get(f"{key}.ci95")
    if ci is not None and value is not None:
        text += f" ±{fmt.format(ci * scale).rstrip('%')}"
    return text


def _fit(widths: list[int], room: int) -> list[list[int]]:
    """Columns in groups whose cells fit `room` characters whole (each group: a table of
    its own beside the labels): a number cut to "12…" would be a wrong number."""
    groups: list[list[int]] = [[]]
    used = 0
    for i, w in enumerate(widths):
        if groups[-1] and used + w + 3 > room:  # 3: padding and the border
            groups.append([])
            used = 0
        groups[-1].append(i)
        used += w + 3
    return groups


def invalid(row: dict[str, Any]) -> bool:
    """A sweep.csv row with a run that flagged itself INVALID (`valid`: the share that did
    not; older files have no `invalid_runs`)."""
    runs = row.get("invalid_runs")
    if isinstance(runs, int | float) and runs == runs:
        return runs > 0
    valid = row.get("valid")
    return isinstance(valid, int | float) and valid == valid and valid < 1


INVALID_TEXT = (
    "INVALID points ({} of {}): the load generator could not keep to its schedule there, so "
    "their numbers are not the load asked for (each run's summary.json says by how much)"
)


def _best(members: list[dict[str, Any]], key: str, higher: bool) -> dict[str, Any] | None:
    """The best valid row: an INVALID one was not given the load its row names."""
    scored = [m for m in members if m.get(key) is not None and not invalid(m)]
    if not scored:
        return None
    return (max if higher else min)(scored, key=lambda m: m[key])


def _print_knees(
    console: Console,
    rows: list[dict[str, Any]],
    settings: list[str],
    load: str,
    target: float = SLO_ATTAINMENT,
) -> None:
    """The highest load each setting served with >= `target` of requests inside the SLO."""
    if all(r.get("slo_attainment") is None for r in rows):
        return
    by_setting: dict[tuple, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        by_setting[tuple(r[s] for s in settings)].append(r)
    table = Table(title=f"SLO knee: highest {load} with {target:.0%} in SLO")
    table.add_column(" ".join(settings))
    table.add_column(load, justify="right")
    for setting, members in by_setting.items():
        table.add_row(" ".join(map(str, setting)), knee(members, load, target))
    console.print(table)


def knee(members: list[dict[str, Any]], load: str, target: float = SLO_ATTAINMENT) -> str:
    """The highest load served; when every load tested was served the knee lies beyond them,
    and naming the highest tested as the knee would claim a limit nobody measured. Where the
    share in SLO rose with the load beyond noise, the knee is marked DOUBTFUL: the bisection
    and the reading "served up to here" both assume it falls."""
    tested = [m for m in members if m.get("slo_attainment") is not None]
    served = [m[load] for m in tested if m["slo_attainment"] >= target]
    rise = attainment_rise(tested, load)
    doubt = f" (DOUBTFUL: {rise})" if rise else ""
    if not served:
        return "none" + doubt
    highest = max(served, key=load_order)
    # a knee read off a point that did not get its load is named, not hidden
    mark = " (INVALID)" if any(invalid(m) for m in tested if m[load] == highest) else ""
    if len(served) == len(tested):
        return f"not reached up to {highest}{mark}{doubt}"
    below = [m[load] for m in tested if m[load] not in served and _lighter(m[load], highest)]
    if below and not doubt:  # "served up to here" would be untrue, if within noise
        doubt = f" (not served at {load}={', '.join(map(str, below))} below it)"
    return f"{highest}{mark}{doubt}"


def _lighter(value: Any, than: Any) -> bool:
    return load_order(value) < load_order(than)


def attainment_rise(members: list[dict[str, Any]], load: str) -> str | None:
    """Where the share in SLO at a higher load beats that at a lower one by more than noise
    (as words), else None. Noise: the repeats' 95 % intervals where both rows have them,
    else a two-proportion z-test at 95 % on the requests sent (a row without counts: any
    rise counts)."""
    tested = sorted(
        (m for m in members if _finite(m.get("slo_attainment"))),
        key=lambda m: load_order(m[load]),
    )
    worst: tuple[float, dict[str, Any], dict[str, Any]] | None = None
    for i, low in enumerate(tested):
        for high in tested[i + 1 :]:
            gain = high["slo_attainment"] - low["slo_attainment"]
            if gain > 0 and _beyond_noise(low, high) and (worst is None or gain > worst[0]):
                worst = (gain, low, high)
    if worst is None:
        return None
    _, low, high = worst
    return (
        f"in SLO rose with the load, {low['slo_attainment']:.0%} at {load}={low[load]} to "
        f"{high['slo_attainment']:.0%} at {load}={high[load]}"
    )


def _beyond_noise(low: dict[str, Any], high: dict[str, Any]) -> bool:
    p1, p2 = low["slo_attainment"], high["slo_attainment"]
    ci1, ci2 = low.get("slo_attainment.ci95"), high.get("slo_attainment.ci95")
    if _finite(ci1) and _finite(ci2):
        return p1 + ci1 < p2 - ci2
    n1, n2 = _sent(low), _sent(high)
    if n1 is None or n2 is None:
        return True
    pooled = (p1 * n1 + p2 * n2) / (n1 + n2)
    spread = math.sqrt(pooled * (1 - pooled) * (1 / n1 + 1 / n2))
    return p2 - p1 > 1.96 * spread


def _sent(row: dict[str, Any]) -> float | None:
    """Requests sent over the row's runs (completed and failed are means a run)."""
    done, failed = row.get("completed"), row.get("failed")
    if not (_finite(done) and _finite(failed)) or done + failed <= 0:
        return None
    runs = row.get("runs")
    return (done + failed) * (runs if _finite(runs) and runs >= 1 else 1)


def _finite(value: Any) -> bool:
    """A real number (numpy's too: rows read back from sweep.csv), not NaN or infinite."""
    return isinstance(value, numbers.Real) and math.isfinite(value)


def load_order(value: Any) -> float:
    """Loads ordered lightest first: `--rates auto`'s synchronous point (one request at a
    time, named "sync" on the rate axis) below every rate."""
    return -math.inf if value == SYNC else float(value)
