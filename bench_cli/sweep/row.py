"""One sweep.csv row from a point's runs: every metric of each run's summary (as the metric
registry lists them), the share of requests in SLO, and each metric's mean over the repeats
with its spread and 95 % confidence interval."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from bench_cli.sweep.grid import SweepPoint
from loadgen import metric_registry
from loadgen.metrics import STATS

# A traffic class's headline in sweep.csv (the run's own metrics are all kept, from
# loadgen.metric_registry): a mix of four classes would otherwise add hundreds of columns.
CLASS_DISTRIBUTIONS = ("ttft_s", "itl_s", "tpot_s", "e2e_s")
CLASS_SCALARS = ("request_throughput", "output_throughput", "goodput", "completed", "failed")
# Student's t at 97.5 % for 1..30 degrees of freedom: 95 % two-sided confidence intervals.
T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179)
T975 += (2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064)
T975 += (2.060, 2.056, 2.052, 2.048, 2.045, 2.042)


def t975(df: int) -> float:
    return T975[df - 1] if df <= len(T975) else 1.96 + 2.4 / df


def metrics_of(summary: dict[str, Any]) -> dict[str, Any]:
    """What sweep.csv keeps of one run: every metric of the registry its summary has (each
    distribution's statistics as DIST.STAT, a boolean as 0/1 so repeats average to a share),
    then the telemetry's numbers and traffic classes' headlines."""
    out: dict[str, Any] = {}
    for m in metric_registry.of_kind("distribution"):
        if summary.get(m.name):
            out |= {f"{m.name}.{s}": summary[m.name][s] for s in STATS}
    for m in metric_registry.of_kind("scalar"):
        value = summary.get(m.name)  # older summaries lack newer metrics: an empty cell
        out[m.name] = float(value) if isinstance(value, bool) else value
    target = (summary.get("config") or {}).get("target") or {}
    out["simulated"] = float(target.get("kind") == "simulated")  # bench run --engine sim
    for key, value in (summary.get("telemetry") or {}).items():  # peak RSS, KV blocks, ...
        if isinstance(value, int | float) and key != "samples":
            out[f"telemetry.{key}"] = value
    out["slo_attainment"] = slo_attainment(summary)
    cached = summary.get("total_cached_tokens")  # only where the server's usage reports it
    if cached is not None:
        out["prompt_tokens_computed"] = summary["total_input_tokens"] - cached
    for name, c in (summary.get("classes") or {}).items():  # a mix: each class's headline
        out |= {f"class.{name}.{k}": v for k, v in class_metrics(c).items()}
    return out


def class_metrics(summary: dict[str, Any]) -> dict[str, float | None]:
    """What sweep.csv keeps of one traffic class: its latency p50/p99, throughputs, goodput
    by its own SLO and attainment (class.NAME.ttft_s.p99, ...)."""
    out = {f"{d}.{s}": summary[d][s] for d in CLASS_DISTRIBUTIONS for s in ("p50", "p99")}
    out |= {k: summary[k] for k in CLASS_SCALARS}
    out["slo_attainment"] = slo_attainment(summary)
    cached = summary.get("total_cached_tokens")  # only where the server's usage reports it
    if cached is not None:
        out["prompt_tokens_computed"] = summary["total_input_tokens"] - cached
    return out


def slo_attainment(summary: dict[str, Any]) -> float | None:
    """The fraction of all requests sent that met every SLO (DistServe): a failed request is a
    miss, not left out, or a server that fails its slow requests would look better for it."""
    if summary.get("goodput") is None:
        return None  # no SLO given
    sent = summary["completed"] + summary["failed"] + summary.get("cancelled", 0)
    if not summary["completed"]:
        return 0.0 if sent else None
    # goodput and request_throughput share the run's duration: their ratio is good / completed
    good = summary["goodput"] / summary["request_throughput"] * summary["completed"]
    return good / sent


def aggregate(point: SweepPoint, summaries: list[dict[str, Any]]) -> dict[str, Any]:
    """One sweep.csv row: the point's settings, then each metric's mean over its runs, with
    `.std` and `.ci95` (half-width of the 95 % confidence interval) when repeated."""
    row: dict[str, Any] = {"point": point.index, **point.values}
    row |= {k: v for k, v in point.settings.items() if k not in row}  # a bundle's settings
    row["runs"] = len(summaries)
    # runs that flagged themselves INVALID (schedule not kept): shown wherever the point is
    row["invalid_runs"] = sum(not s.get("valid", True) for s in summaries)
    runs = [metrics_of(s) for s in summaries]
    for key in dict.fromkeys(k for r in runs for k in r):  # every run's keys, in order
        values = np.array([r[key] for r in runs if r.get(key) is not None], dtype=np.float64)
        row[key] = float(values.mean()) if len(values) else None
        if len(summaries) > 1:  # a metric no run had (an older summary's): no spread
            std = float(values.std(ddof=1)) if len(values) > 1 else math.nan
            row[f"{key}.std"] = std
            row[f"{key}.ci95"] = (
                t975(len(values) - 1) * std / math.sqrt(len(values)) if len(values) else math.nan
            )
    return row
