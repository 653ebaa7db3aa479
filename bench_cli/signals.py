"""What each telemetry column measures and in which unit, in one place: the live view labels
its sparklines with it and the report puts one y axis per unit, so a 3,000 MB RSS never
flattens a CPU % or a count of requests drawn on the same axis."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Signal:
    label: str  # "server CPU"
    unit: str  # "% (100 = one core)"
    axis: str  # the report's y axis title; signals with the same one share an axis


# (column name suffix, what it is, unit, axis), first match wins
RULES = (
    ("steal_percent", "CPU stolen", "% (100 = one core)", "CPU % (100 = one core)"),
    ("cpu_percent", "CPU", "% (100 = one core)", "CPU % (100 = one core)"),
    ("util_percent", "utilisation", "%", "GPU utilisation (%)"),
    ("memory_used_mb", "memory used", "MB", "memory (MB)"),
    ("rss_mb", "RSS", "MB", "memory (MB)"),
    ("_mb", "", "MB", "memory (MB)"),
    ("power_w", "power", "W", "power (W)"),
    ("sm_clock_mhz", "SM clock", "MHz", "clock (MHz)"),
    ("kv_usage", "KV cache used", "fraction", "KV cache (fraction used)"),
    ("kv_peak_blocks_used", "KV blocks, peak", "blocks", "KV blocks"),
    ("kv_blocks_used", "KV blocks used", "blocks", "KV blocks"),
    ("running", "running", "requests", "requests in the engine"),
    ("waiting", "waiting", "requests", "requests in the engine"),
    ("preemptions", "preempted so far", "requests", "requests in the engine"),
    ("prefix_cache_queries", "prefix cache lookups", "tokens", "prefix cache (tokens so far)"),
    ("prefix_cache_hits", "prefix cache hits", "tokens", "prefix cache (tokens so far)"),
)


def signal(name: str) -> Signal:
    """`server_cpu_percent` -> Signal("server CPU", "% (100 = one core)", ...)."""
    for suffix, what, unit, axis in RULES:
        if name.endswith(suffix):
            owner = name[: -len(suffix)].strip("_")  # server, gpu0, engine
            return Signal(" ".join(p for p in (owner, what) if p), unit, axis)
    return Signal(name.replace("_", " "), "", name)
