"""A process's CPU share sampled from /proc: how busy a benchmark's server was, so that a
figure it limited is marked rather than credited to the client (loadgen_side_by_side.py)."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path


class CpuShare:
    """A process's CPU time sampled from /proc every `period_s`; `peak()` is its busiest
    window of at least one second, as a share of one core."""

    def __init__(self, pid: int, period_s: float = 0.2) -> None:
        self.pid, self.period_s = pid, period_s
        self.samples: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _cpu_s(self) -> float:
        fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime

    def _run(self) -> None:
        while not self._stop.is_set():
            self.samples.append((time.monotonic(), self._cpu_s()))
            self._stop.wait(self.period_s)

    def __enter__(self) -> CpuShare:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.samples.append((time.monotonic(), self._cpu_s()))

    def peak(self) -> float | None:
        best, j = None, 0
        for i, (t0, c0) in enumerate(self.samples):
            j = max(j, i + 1)
            while j < len(self.samples) and self.samples[j][0] - t0 < 1.0:
                j += 1
            if j == len(self.samples):
                break
            t1, c1 = self.samples[j]
            share = (c1 - c0) / (t1 - t0)
            best = share if best is None else max(best, share)
        if best is None and len(self.samples) > 1 and self.samples[-1][0] > self.samples[0][0]:
            (t0, c0), (t1, c1) = self.samples[0], self.samples[-1]
            best = (c1 - c0) / (t1 - t0)  # under a second in all: its whole span
        return best
