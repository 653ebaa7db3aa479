"""A process's CPU share sampled from /proc: how busy a benchmark's server was, so that a
figure it limited is marked rather than credited to the client (loadgen_side_by_side.py).

CPU time alone misses a server starved of its core by other processes (on a shared machine
it queues requests while its CPU share stays low), so the time its main thread spent
runnable but waiting for a CPU (/proc/PID/schedstat's run delay) is sampled beside it:
CPU + wait near 100% of the wall clock is a saturated server, whoever held the core."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path


class CpuShare:
    """CPU seconds and run-queue wait sampled every `period_s`; `peaks()` gives the busiest
    window of at least one second, as shares of one core: (CPU, CPU + wait)."""

    def __init__(self, pid: int, period_s: float = 0.2) -> None:
        self.pid, self.period_s = pid, period_s
        self.samples: list[tuple[float, float, float]] = []  # (time, CPU s, wait s)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self) -> tuple[float, float, float]:
        fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime
        try:  # on CPU ns, run-queue wait ns, time slices (kernels with schedstats)
            wait = int(Path(f"/proc/{self.pid}/schedstat").read_text().split()[1]) / 1e9
        except (OSError, IndexError, ValueError):
            wait = 0.0
        return time.monotonic(), cpu, wait

    def _run(self) -> None:
        while not self._stop.is_set():
            self.samples.append(self._sample())
            self._stop.wait(self.period_s)

    def __enter__(self) -> CpuShare:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.samples.append(self._sample())

    def peaks(self) -> tuple[float | None, float | None]:
        windows = []
        j = 0
        for i, (t0, _, _) in enumerate(self.samples):
            j = max(j, i + 1)
            while j < len(self.samples) and self.samples[j][0] - t0 < 1.0:
                j += 1
            if j == len(self.samples):
                break
            windows.append((i, j))
        if not windows and len(self.samples) > 1 and self.samples[-1][0] > self.samples[0][0]:
            windows = [(0, len(self.samples) - 1)]  # under a second in all: its whole span
        if not windows:
            return None, None
        cpu, demand = [], []
        for i, j in windows:
            (t0, c0, w0), (t1, c1, w1) = self.samples[i], self.samples[j]
            cpu.append((c1 - c0) / (t1 - t0))
            demand.append((c1 - c0 + w1 - w0) / (t1 - t0))
        return max(cpu), max(demand)
