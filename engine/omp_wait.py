"""Let torch's OpenMP threads sleep, not spin, while they wait for the next parallel region.

torch's CPU wheels bundle GNU libgomp, whose idle threads by default spin ~300,000 times
(milliseconds) before sleeping. A decode step runs ~100 parallel regions (each linear, each
attention, each fused loop of a compiled graph) with Python between them. On a quiet machine
the spin is cheap; beside another process it is what collapses the engine: the spinning
threads take the cores the neighbour wants, the scheduler deschedules one of ours, and every
following region waits for it at its barrier (figures: docs/results/2026-12-06-contention.md).
vLLM gets the same effect from Intel OpenMP with a short KMP_BLOCKTIME.

libgomp reads OMP_WAIT_POLICY once, when it is loaded (with torch): hence at `import
engine`, as cpu_alloc's allocator settings. A user's OMP_WAIT_POLICY or GOMP_SPINCOUNT wins;
`SERVEBENCH_OMP_PASSIVE=0` leaves libgomp's default. The variable is inherited by the
processes the engine's process starts."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

USER_VARS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")


@dataclass(frozen=True, slots=True)
class WaitPolicy:
    policy: str  # what libgomp runs with: "passive", libgomp's "default", or the user's value
    reason: str  # why, for the start-up log


def sleep_when_idle() -> WaitPolicy:
    """Set OMP_WAIT_POLICY=PASSIVE unless the user chose, opted out, or torch came first."""
    for var in USER_VARS:
        if var in os.environ:
            return WaitPolicy(f"{var}={os.environ[var]}", "set by the user")
    if os.environ.get("SERVEBENCH_OMP_PASSIVE") == "0":
        return WaitPolicy("default", "SERVEBENCH_OMP_PASSIVE=0")
    if "torch" in sys.modules:  # libgomp has read its environment already
        return WaitPolicy("default", "torch was imported before engine: threads spin when idle")
    os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
    return WaitPolicy("passive", "idle threads sleep (robust beside other processes)")


state = sleep_when_idle()  # once, at `import engine`
