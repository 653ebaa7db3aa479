"""The sweep report's opening verdict (as claims.html opens with its verdicts): at each load,
which setting is best for the stated SLO, by how much over the next, and whether that margin
is larger than the run-to-run noise, with the workload and the SLO written out, so that the
answer is read before any chart and cannot be taken for another workload's."""

from __future__ import annotations

import html
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from rich.console import Console
from rich.markup import escape

from bench_cli.sweep.grid import LOAD_AXES
from bench_cli.sweep.table import SLO_ATTAINMENT, invalid, knee


@dataclass(frozen=True, slots=True)
class Line:
    load: str  # "rate=4", or "all" without a load axis
    best: str | None  # the setting, None when no valid point
    metric: str  # what "best" means
    text: str  # the sentence
    rivals: int = 1  # valid settings it was compared with there


def slo_of(plan: dict[str, Any]) -> str | None:
    return (plan.get("flags") or {}).get("slo") or (plan.get("profile") or {}).get("slo")


def workload_text(plan: dict[str, Any]) -> str:
    """The load every point ran, in words: the verdict holds for this workload only."""
    p = plan.get("profile") or {}
    flags = {k: v for k, v in (plan.get("flags") or {}).items() if v is not None}
    p = p | flags
    parts = [f"model {p['model']}"] if p.get("model") else []
    if p.get("dataset"):
        parts.append(f"dataset {p['dataset']}")
    if p.get("input_len"):
        parts.append(f"input {p['input_len']} tokens")
    if p.get("output_len"):
        parts.append(f"output {p['output_len']} tokens")
    if p.get("num_requests"):
        parts.append(f"{p['num_requests']} requests a run")
    if p.get("duration"):
        parts.append(f"{p['duration']} s a run")
    if p.get("arrival"):
        parts.append(f"{p['arrival']} arrivals")
    return ", ".join(parts) or "the default profile's load"


def _noise(best: dict[str, Any], other: dict[str, Any], key: str) -> str:
    ci_b, ci_o = best.get(f"{key}.ci95"), other.get(f"{key}.ci95")
    if ci_b is None or ci_o is None or ci_b != ci_b or ci_o != ci_o:
        return "one run each: no noise estimate (--repeat 3 gives one)"
    if best[key] - ci_b <= other[key] + ci_o:
        return "WITHIN run-to-run noise (the 95 % intervals overlap): not a difference"
    return "beyond run-to-run noise (the 95 % intervals do not overlap)"


def verdict_lines(
    rows: list[dict[str, Any]],
    axes: list[str],
    load: str | None,
    slo: str | None,
    target: float = SLO_ATTAINMENT,
) -> list[Line]:
    """One line a load naming the best setting there; a sweep of one setting (loads only, or
    one point) has none to choose, so its line says what it does show instead."""
    settings = [a for a in axes if a != load]

    def name(r: dict[str, Any]) -> str:
        return " ".join(f"{a}={r[a]}" for a in settings)

    with_slo = slo is not None and any(_num(r.get("goodput")) is not None for r in rows)
    key, what = (
        ("goodput", "goodput (req/s in SLO)") if with_slo else ("output_throughput", "output tok/s")
    )
    if not rows:
        return []
    if all(invalid(r) for r in rows):
        text = (
            f"no verdict: all {len(rows)} points are INVALID (the load generator could not keep "
            "to its schedule, so no point got the load it names)"
        )
        return [Line("all", None, what, text)]
    if len({name(r) for r in rows}) == 1:
        return [_one_setting(rows, name(rows[0]), load, key, what, with_slo, target)]
    groups: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        groups[f"{load}={r[load]}" if load else "all"].append(r)
    lines = []
    for where, members in groups.items():
        at = f"at {where}: " if load else ""
        valid = _ranked(members, key)
        bad = [name(r) for r in members if invalid(r)]
        skipped = f" ({', '.join(bad)}: INVALID, left out)" if bad else ""
        if not valid:
            lines.append(Line(where, None, what, f"{at}no valid point{skipped}"))
            continue
        best = valid[0]
        if len(valid) == 1:
            text = f"{at}{name(best)}, the only valid setting{skipped}"
            lines.append(Line(where, name(best), what, text, rivals=0))
            continue
        else:
            other = valid[1]
            gain = (best[key] / other[key] - 1) * 100 if other[key] else float("inf")
            text = (
                f"{at}{name(best)} is best by {what}, {best[key]:.3g} against "
                f"{other[key]:.3g} for {name(other)} (+{gain:.0f} %); "
                f"{_noise(best, other, key)}{skipped}"
            )
        lines.append(Line(where, name(best), what, text))
    if with_slo and load:
        by_setting: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for r in rows:
            by_setting[name(r)].append(r)
        knees = "; ".join(f"{s}: {knee(m, load, target)}" for s, m in by_setting.items())
        text = f"highest {load} with {target:.0%} of requests in SLO: {knees}"
        lines.append(Line("knee", None, "SLO knee", text))
    return lines


def headline(lines: list[Line]) -> str | None:
    """One setting best at every load (the answer in a sentence), or that it depends on the
    load; None where no line names a best setting."""
    chosen = [line for line in lines if line.metric != "SLO knee"]
    named = [line.best for line in chosen]
    if not named or any(b is None for b in named):
        return None
    if len(set(named)) == 1:
        every = " at every load tested" if len(named) > 1 else ""
        if alone := [line.load for line in chosen if not line.rivals]:
            every += f" ({', '.join(alone)}: the only valid setting)"
        return f"best{every}: {named[0]} (by {lines[0].metric})"
    return "the best setting depends on the load: see each line"


def _ranked(members: list[dict[str, Any]], key: str) -> list[dict[str, Any]]:
    """The valid rows with a value for `key`, best first."""
    scored = (r for r in members if not invalid(r) and _num(r.get(key)) is not None)
    return sorted(scored, key=lambda r: r[key], reverse=True)


def _one_setting(
    rows: list[dict[str, Any]],
    setting: str,
    load: str | None,
    key: str,
    what: str,
    with_slo: bool,
    target: float,
) -> Line:
    """A sweep of one setting: what it measured (the SLO knee over its loads, the most it
    served), never "the best setting"."""
    which = f" ({setting})" if setting else ""
    bad = [f"{load}={r[load]}" if load else "the point" for r in rows if invalid(r)]
    skipped = f" ({', '.join(bad)}: INVALID, left out)" if bad else ""
    valid = _ranked(rows, key)
    if load and len(rows) > 1:
        text = f"one setting{which} at {len(rows)} loads: no setting to choose between; "
        if with_slo:
            text += (
                f"highest {load} with {target:.0%} of requests in SLO: {knee(rows, load, target)}; "
            )
        if valid:
            text += f"most {what}: {valid[0][key]:.3g} at {load}={valid[0][load]}"
        if not with_slo:
            text += " (no SLO given: no knee)"
        return Line("loads", None, what, text + skipped)
    if not valid:
        return Line("point", None, what, f"one point{which}: no value of {what}{skipped}")
    point = valid[0]
    share = _num(point.get("slo_attainment"))
    in_slo = f", {share:.0%} of requests in SLO" if share is not None else ""
    text = f"one point{which}: {point[key]:.3g} {what}{in_slo}; nothing to compare it with"
    return Line("point", None, what, text)


def slo_target_of(plan: dict[str, Any]) -> float:
    """The share of requests in SLO that makes a load "served" (--slo-target)."""
    return float(plan.get("slo_target") or SLO_ATTAINMENT)


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, int | float) and v == v else None


def verdict_html(rows: list[dict[str, Any]], axes: list[str], load: str | None, plan: dict) -> str:
    slo, target = slo_of(plan), slo_target_of(plan)
    lines = verdict_lines(rows, axes, load, slo, target)
    slo_text = (
        f"{slo} (a request meets it when it meets every bound; a load is served when "
        f"{target:.0%} of requests meet it)"
        if slo
        else ("no SLO given (--slo / slo = ...): best means most output tok/s")
    )
    items = "".join(f"<li>{html.escape(line.text)}</li>" for line in lines)
    if answer := headline(lines):
        items = f"<li><b>{html.escape(answer)}</b></li>" + items
    return (
        "<div style='border:2px solid #333;padding:8px 14px;margin:8px 0'>"
        "<h2 style='margin:4px 0'>Verdict</h2>"
        f"<p><b>Workload:</b> {html.escape(workload_text(plan))}<br><b>SLO:</b> "
        f"{html.escape(slo_text)}</p><ul>{items}</ul></div>"
    )


def print_verdict(
    console: Console, rows: list[dict[str, Any]], axes: list[str], plan: dict[str, Any]
) -> None:
    """The report's verdict in the terminal, under the sweep's tables, with the SLO that
    "in SLO" means."""
    slo, target = slo_of(plan), slo_target_of(plan)
    load = next((a for a in axes if a in LOAD_AXES), None)
    console.print(escape(f"workload: {workload_text(plan)}"), highlight=False)
    if slo:
        console.print(escape(f'"in SLO": share of requests sent that met every bound of {slo}'))
    lines = verdict_lines(rows, axes, load, slo, target)
    if answer := headline(lines):
        console.print(escape(f"verdict: {answer}"), highlight=False)
    for line in lines:
        console.print(escape(f"verdict {line.text}"), highlight=False)
