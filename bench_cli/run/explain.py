"""What a run's headline numbers mean, in two lines, for someone reading them the first
time (`bench run --explain`, which `make demo` uses)."""

from __future__ import annotations

from typing import Any


def _ms(d: dict[str, Any] | None, stat: str) -> str:
    v = (d or {}).get(stat)
    if v is None:
        return "-"
    ms = v * 1e3
    return f"{ms:.2f} ms" if ms < 10 else f"{ms:.1f} ms" if ms < 1000 else f"{ms:,.0f} ms"


def explain(summary: dict[str, Any], load: str) -> list[str]:
    """Two lines: the latencies a user feels, then what the server delivered under the load
    offered (nothing when nothing finished: the error lines say why)."""
    if not summary.get("completed"):
        return []
    ttft, itl = summary.get("ttft_s"), summary.get("itl_s")
    latency = (
        f"TTFT p50 {_ms(ttft, 'p50')} = wait for the first token, ITL p50 {_ms(itl, 'p50')} "
        "= gap between tokens (p99: 1 in 100 slower)"
    )
    served = (
        f"{summary.get('request_throughput') or 0:.2f} req/s, "
        f"{summary.get('output_throughput') or 0:,.0f} output tok/s: what the server "
        f"delivered at {load} offered"
    )
    return [latency, served]
