"""Whether torch's OpenMP threads sleep or spin while they wait for the next parallel region.

torch's CPU wheels bundle GNU libgomp, whose idle threads by default spin ~300,000 times
(milliseconds) before sleeping. A decode step runs ~280 parallel regions (each linear, each
attention, each fused loop of a compiled graph; benchmarks/omp_regions.py). Beside another
process the spinning is what collapses the engine: a thread spins at a barrier on the core
its descheduled partner needs, and each of the step's regions can wait a scheduler slice
(B=8 generate 3.6 s sleeping against 7.6-25 s spinning, beside half a core 4.8 s against
25 s). On a quiet machine sleeping costs instead: waking the partner takes ~40 us on this VM,
~10 ms over a step's regions, which is ~40 % of a one-sequence step (figures:
docs/results/2026-12-06-contention.md). vLLM runs Intel OpenMP with a short KMP_BLOCKTIME.

So by default (`SERVEBENCH_OMP_PASSIVE` unset or `auto`) threads sleep when the machine is
busy when the engine is imported: a 1-minute load average of at least half a core
(BUSY_LOAD), i.e. other processes already compete for the cores. `SERVEBENCH_OMP_PASSIVE=1`
always sleeps, `=0` keeps libgomp's default; a user's OMP_WAIT_POLICY or GOMP_SPINCOUNT wins.
libgomp reads its environment once, when torch loads it: hence at `import engine`, as
cpu_alloc's allocator settings. The variable is inherited by the processes the engine's
process starts."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

USER_VARS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")
BUSY_LOAD = 0.5  # runnable threads of other processes, averaged over a minute


@dataclass(frozen=True, slots=True)
class WaitPolicy:
    policy: str  # "passive" (sleep when idle), libgomp's "default", or the user's setting
    reason: str  # why, for the start-up log


def choose(env: dict[str, str], load: float, torch_loaded: bool) -> WaitPolicy:
    """The policy for this environment, 1-minute load average and import order."""
    for var in USER_VARS:
        if var in env:
            return WaitPolicy(f"{var}={env[var]}", "set by the user")
    switch = env.get("SERVEBENCH_OMP_PASSIVE", "auto")
    if switch == "0":
        return WaitPolicy("default", "SERVEBENCH_OMP_PASSIVE=0")
    if switch != "1" and load < BUSY_LOAD:
        return WaitPolicy("default", f"machine quiet at start (load {load:.2f}): threads spin")
    if torch_loaded:  # libgomp has read its environment already
        return WaitPolicy("default", "torch was imported before engine: threads spin when idle")
    why = "SERVEBENCH_OMP_PASSIVE=1" if switch == "1" else f"machine busy (load {load:.2f})"
    return WaitPolicy("passive", f"{why}: idle threads sleep")


def apply() -> WaitPolicy:
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    chosen = choose(dict(os.environ), load, "torch" in sys.modules)
    if chosen.policy == "passive":
        os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
    return chosen


state = apply()  # once, at `import engine`
