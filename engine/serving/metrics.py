"""The /metrics page in Prometheus' text format: the engine's gauges and counters under
`servebench:`, cumulative histograms, and the process metrics that Prometheus clients export
(`process_resident_memory_bytes`, ...), so a long run's telemetry shows the server's memory."""

from __future__ import annotations

import os
from typing import Any

import psutil

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class Histogram:
    def __init__(self, buckets: tuple[float, ...] = LATENCY_BUCKETS) -> None:
        self.buckets = buckets
        self.counts = [0] * len(buckets)
        self.total = 0
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.total += 1
        self.sum += value
        for i, b in enumerate(self.buckets):
            if value <= b:
                self.counts[i] += 1

    def render(self, name: str, help_: str) -> list[str]:
        lines = [f"# HELP {name} {help_}", f"# TYPE {name} histogram"]
        for b, c in zip(self.buckets, self.counts, strict=True):
            lines.append(f'{name}_bucket{{le="{b}"}} {c}')
        lines.append(f'{name}_bucket{{le="+Inf"}} {self.total}')
        lines += [f"{name}_sum {self.sum}", f"{name}_count {self.total}"]
        return lines


def render_page(
    values: dict[str, tuple[str, float | dict[str, float], str]],
    histograms: dict[str, tuple[Histogram, str]],
    labels: dict[str, Any],
) -> str:
    """The /metrics page: `values` maps a name to (gauge|counter, value, help), every name under
    the `servebench:` prefix; `labels` become one info-style `servebench:config` gauge."""
    lines = []
    for name, (kind, value, help_) in values.items():
        lines += sample(f"servebench:{name}", kind, value, help_)
    for name, (hist, help_) in histograms.items():
        lines += hist.render(f"servebench:{name}", help_)
    lines += process_metrics()
    config = ",".join(f'{k}="{label_value(v)}"' for k, v in labels.items())
    lines += [
        "# HELP servebench:config the engine's resolved settings",
        "# TYPE servebench:config gauge",
        f"servebench:config{{{config}}} 1",
    ]
    return "\n".join(lines) + "\n"


def process_metrics() -> list[str]:
    """The standard `process_*` metrics of Prometheus clients, for this process."""
    proc = psutil.Process(os.getpid())
    with proc.oneshot():
        mem, cpu = proc.memory_info(), proc.cpu_times()
        values = {
            "process_resident_memory_bytes": ("gauge", mem.rss, "Resident memory size in bytes."),
            "process_virtual_memory_bytes": ("gauge", mem.vms, "Virtual memory size in bytes."),
            "process_cpu_seconds_total": (
                "counter",
                cpu.user + cpu.system,
                "Total user and system CPU time spent in seconds.",
            ),
            "process_start_time_seconds": (
                "gauge",
                proc.create_time(),
                "Start time of the process since unix epoch in seconds.",
            ),
            "process_open_fds": ("gauge", proc.num_fds(), "Number of open file descriptors."),
        }
    lines = []
    for name, (kind, value, help_) in values.items():
        lines += sample(name, kind, value, help_)
    return lines


def sample(name: str, kind: str, value: float | dict[str, float], help_: str) -> list[str]:
    """One gauge or counter: its HELP and TYPE lines and its value, or its values by label
    set (`{'position="0"': 3}`)."""
    lines = [f"# HELP {name} {help_}", f"# TYPE {name} {kind}"]
    if isinstance(value, dict):
        return lines + [f"{name}{{{labels}}} {v}" for labels, v in value.items()]
    return [*lines, f"{name} {value}"]


def label_value(value: Any) -> str:
    """A label value in the text format: backslash, double quote and newline escaped."""
    return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
