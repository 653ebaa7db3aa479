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

So by default (`SERVEBENCH_OMP_PASSIVE` unset or `auto`) idle threads spin SPIN_COUNT times
before they sleep: near full spinning's speed on a quiet machine (B=1 0.72 s against 0.76
float32, B=8 +8-10 %), and no collapse beside a neighbour (beside a 2-thread torch loop B=1
float32 1.54 s against 2.53 spinning and 1.37 sleeping; `bench run`'s decode steps 44.8 ms
against 49.8 spinning and 61.4 sleeping; docs/results/2026-12-07-neighbours-quiet.md). The
rule it replaces chose from the load average at start-up, which our own start-up moved: two
engines of one benchmark got different policies, and a sleeping engine on a quiet machine
decoded one sequence 2-3x slower. `SERVEBENCH_OMP_PASSIVE=1` always sleeps, `=0` keeps
libgomp's default; a user's OMP_WAIT_POLICY or GOMP_SPINCOUNT wins.

libgomp reads its environment once, when torch loads it: hence at `import engine`, as
cpu_alloc's allocator settings. The variable is inherited by the processes the engine's
process starts.

The spin count holds only while libgomp manages no more threads than there are CPUs. Each
thread that has run a parallel region keeps a pool of its own, and with more pooled threads
than CPUs every idle thread spins 100 times, whatever GOMP_SPINCOUNT says: it sleeps and is
woken at every region. The server builds and warms the engine on one thread and steps it on
another, so its decode steps ran 1.5-2x slower than the same steps offline
(docs/results/2026-12-07-one-openmp-pool.md). `release_thread_pool` frees a thread's pool, so
the thread that steps the engine holds the only one.

Where every heavy op of a step is the engine's own kernel, they run on a pool of their own
and torch's ops on one thread (engine/kernel_pool.py): no OpenMP team is left to wait for, and
this policy matters only to engines that keep OpenMP (fp8 weights or cache,
SERVEBENCH_CPU_POOL=0)."""

from __future__ import annotations

import ctypes
import functools
import logging
import os
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

USER_VARS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")
SPIN_COUNT = 3000  # libgomp's default is 300,000 (milliseconds of spinning)


@dataclass(frozen=True, slots=True)
class WaitPolicy:
    policy: str  # "passive" (sleep when idle), libgomp's "default", or the user's setting
    reason: str  # why, for the start-up log


def choose(env: dict[str, str], torch_loaded: bool) -> WaitPolicy:
    """The policy for this environment and import order."""
    for var in USER_VARS:
        if var in env:
            return WaitPolicy(f"{var}={env[var]}", "set by the user")
    switch = env.get("SERVEBENCH_OMP_PASSIVE", "auto")
    if switch == "0":
        return WaitPolicy("default", "SERVEBENCH_OMP_PASSIVE=0")
    if torch_loaded:  # libgomp has read its environment already
        return WaitPolicy("default", "torch was imported before engine: threads spin when idle")
    if switch == "1":
        return WaitPolicy("passive", "SERVEBENCH_OMP_PASSIVE=1: idle threads sleep")
    return WaitPolicy(
        f"spin {SPIN_COUNT}", "short spins, then sleep: fast when quiet, no collapse beside others"
    )


def apply() -> WaitPolicy:
    chosen = choose(dict(os.environ), "torch" in sys.modules)
    if chosen.policy == "passive":
        os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
    elif chosen.policy == f"spin {SPIN_COUNT}":
        os.environ["GOMP_SPINCOUNT"] = str(SPIN_COUNT)
    return chosen


@functools.cache
def _libgomp() -> ctypes.CDLL | None:
    """The libgomp this process has loaded (torch's own copy), or None (another OpenMP, or
    not Linux): found in /proc/self/maps, as loading "libgomp.so.1" by name could bring in a
    second copy whose pools are not torch's."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return None
    for line in maps.splitlines():
        parts = line.split(maxsplit=5)
        if len(parts) == 6 and os.path.basename(parts[5]).startswith("libgomp"):
            lib = ctypes.CDLL(parts[5])
            return lib if hasattr(lib, "omp_pause_resource_all") else None  # OpenMP 5.0+
    return None


_released: set[int] = set()  # threads whose pools release_thread_pool freed


def release_thread_pool() -> bool:
    """Free the calling thread's OpenMP thread pool, if it has one (a later parallel region
    on this thread makes a new one). True where libgomp did it."""
    lib = _libgomp() if "torch" in sys.modules else None
    freed = lib is not None and lib.omp_pause_resource_all(1) == 0  # omp_pause_soft
    if freed:
        _released.add(threading.get_ident())
    return freed


class SteppingThread:
    """Warns once per change of thread when an engine built on one thread is stepped on
    another while the first may still hold its pool: steps up to 2x slower, silently."""

    def __init__(self, cpu: bool) -> None:
        self.cpu = cpu
        self.built_on = threading.get_ident()
        self.stepped_on: int | None = None

    def check(self) -> None:
        thread = threading.get_ident()
        if thread == self.stepped_on or not self.cpu:
            return
        self.stepped_on = thread
        builder_alive = any(t.ident == self.built_on for t in threading.enumerate())
        torch = sys.modules.get("torch")
        pooled = torch is not None and torch.get_num_threads() > 1 and _libgomp() is not None
        if thread != self.built_on and builder_alive and pooled and self.built_on not in _released:
            logging.getLogger(__name__).warning(
                "the engine is stepped on a thread other than the one that built it: call "
                "engine.omp_wait.release_thread_pool() on the building thread first, or every "
                "step waits on OpenMP's throttled threads (up to 2x slower)"
            )


state = apply()  # once, at `import engine`
