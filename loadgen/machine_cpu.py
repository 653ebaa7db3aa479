"""The whole machine's CPU time during a run: how much every process used (the server, the
load generator and whatever else ran beside them), and how much a hypervisor gave to other
guests while this machine's CPUs wanted to run (steal).

Steal is what a VM's benchmark cannot see from inside its processes: a CPU taken away for
milliseconds stalls an engine step or a chunk's parse as surely as a busy neighbour does,
and every latency of the run carries it. A run that measured such pauses says so; the busy
column shows neighbours (machine CPU well above the server's and the client's).

Linux counts both in /proc/stat (psutil.cpu_times); other systems have no steal, and their
rows carry only the busy column."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

# Warn when the hypervisor took at least this share of the machine's CPU time over the run.
STEAL_WARN = 0.05


class MachineCpu:
    """Busy and stolen CPU between consecutive samples, as % of one core (100 = one core
    busy for the whole interval, as the server's CPU %)."""

    def __init__(
        self, cpu_times: Callable[[], Any] | None = None, cpus: int | None = None
    ) -> None:  # the machine's counters (psutil's) unless given: tests give their own
        import psutil

        self._cpu_times = cpu_times or psutil.cpu_times
        self.cpus = cpus or psutil.cpu_count() or 1
        self.has_steal = hasattr(self._cpu_times(), "steal")  # Linux only
        self._last = self._read()

    def _read(self) -> tuple[float, float, float]:
        """(busy, steal, total) CPU seconds since boot, all CPUs together."""
        t = self._cpu_times()
        total = sum(t)
        steal = float(getattr(t, "steal", 0.0))
        idle = t.idle + float(getattr(t, "iowait", 0.0))
        # guest time is counted inside user on Linux: sum() counts it twice
        guest = float(getattr(t, "guest", 0.0)) + float(getattr(t, "guest_nice", 0.0))
        total -= guest
        return total - idle - steal, steal, total

    def sample(self, row: dict[str, float]) -> None:
        busy, steal, total = self._read()
        b0, s0, t0 = self._last
        if total <= t0:  # the counters tick every 10 ms: nothing new yet
            return
        self._last = (busy, steal, total)
        scale = 100.0 * self.cpus / (total - t0)  # CPU seconds -> % of one core
        full = 100.0 * self.cpus
        # idle can step back a tick on some kernels (NO_HZ accounting): clamped, not -0.0
        row["machine_cpu_percent"] = min(full, max(0.0, (busy - b0) * scale))
        if self.has_steal:
            row["machine_steal_percent"] = min(full, max(0.0, (steal - s0) * scale))


def steal_share(mean_percent: float, cpus: int) -> float:
    """Steal as a share of the machine's CPU time, from machine_steal_percent (% of one core)."""
    return mean_percent / (100.0 * cpus)


def steal_warning(telemetry: dict[str, Any]) -> str | None:
    """The run's warning when the hypervisor took STEAL_WARN of the machine's CPU time or
    more (the mean of the timeline's machine_steal_percent), else None."""
    mean = telemetry.get("mean_machine_steal_percent")
    if mean is None:
        return None
    share = steal_share(mean, telemetry.get("machine_cpus", 1))
    if share < STEAL_WARN:
        return None
    peak = telemetry.get("peak_machine_steal_percent", mean)
    return (
        f"the hypervisor gave {share:.0%} of this machine's CPU time to other guests during "
        f"the run (steal, peak {peak:.0f} % of one core in a sample; timeline.csv's "
        "machine_steal_percent): every latency and throughput here includes those pauses. "
        "Compare it only with runs on a host as busy, or rerun when steal is near 0"
    )
