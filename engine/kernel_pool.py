"""Where a CPU engine's parallel work runs: on its kernels' own thread pool
(engine/ops/cpu_pool.h), with torch's ops on one thread, wherever the model's heavy work is
all the engine's kernels.

torch's OpenMP splits every parallel region in equal shares up front, so each of a decode
step's ~280 regions waits for its slowest thread. Beside another process, or on a VM whose
host is busy, that thread is often not running, and a step waits a scheduler slice per
region. The pool hands out small chunks to whichever thread runs, the caller included: a
partner that is not scheduled costs the chunk it holds, no more. Measured
(`benchmarks/noisy_neighbour.py`, docs/results/2026-12-07-kernel-pool.md): 8 sequences beside
a 2-thread torch loop took 1.56x (float32) and 1.61x (bf16) their quiet time, against 2.97x and
3.64x on OpenMP and vLLM's 2.55x and 2.98x; beside half a core 1.18x and 1.20x. Quiet, that
generate ran 2-7 % slower than on OpenMP (prefill's norms and activations on one thread).

With the pool, torch's own ops (the compiled graphs' norms and activations, sampling) run on
one thread: there is no second OpenMP team left to wait for. So the pool is taken only where
nothing heavy is torch's: every linear packed for the kernels, and a KV cache in the model's
dtype that the attention kernels read (an fp8 cache's prefill is torch's SDPA). Elsewhere
torch keeps its threads. `SERVEBENCH_CPU_POOL=0` keeps OpenMP for everything.

It is the process's setting (torch's thread count is), made as a runner is built, before its
graphs compile: a later engine in the same process re-decides, and gives torch its threads
back where it takes no pool."""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import nn

from engine.ops import cpu_kernels
from engine.ops.fp8 import Fp8Linear

logger = logging.getLogger(__name__)
# An idle worker's spin (yielding to anything else that wants the core) before it sleeps, in
# microseconds: a step's gaps between regions are shorter. SERVEBENCH_POOL_SPIN_US sets it.
SPIN_US = int(os.environ.get("SERVEBENCH_POOL_SPIN_US", "100"))
_threads = {"torch": 0}  # torch's thread count before the first pool took it (0: none yet)


@dataclass(frozen=True, slots=True)
class ThreadPlan:
    pool_threads: int  # the kernels' pool, the calling thread included (1: no pool)
    reason: str


_taken: list[ThreadPlan] = []  # the plan the last runner built took


def current() -> ThreadPlan | None:
    """How this process's CPU threads are used now (None: no CPU runner built yet)."""
    return _taken[-1] if _taken else None


@contextlib.contextmanager
def machine_threads() -> Iterator[None]:
    """torch's threads as they were before a pool took them, for code that measures the
    machine (bench_cli/device_peak.py) in a process whose engine holds the pool."""
    if not _threads["torch"]:
        yield
        return
    held = torch.get_num_threads()
    torch.set_num_threads(_threads["torch"])
    try:
        yield
    finally:
        torch.set_num_threads(held)


def plan(model: nn.Module, kv_dtype: torch.dtype, head_dim: int, threads: int) -> ThreadPlan:
    """The pool for this model and cache with `threads` CPU threads, and why."""
    if os.environ.get("SERVEBENCH_CPU_POOL") == "0":
        return ThreadPlan(1, "SERVEBENCH_CPU_POOL=0: OpenMP's threads for everything")
    if threads < 2:
        return ThreadPlan(1, "one thread")
    if not cpu_kernels.BUILT["ok"]:
        return ThreadPlan(1, "the engine's CPU kernels are not built: torch's ops and threads")
    torch_linears = (nn.Linear, Fp8Linear)
    left = sorted({type(m).__name__ for m in model.modules() if isinstance(m, torch_linears)})
    if left:
        return ThreadPlan(1, f"linears on torch's ops ({', '.join(left)}): OpenMP's threads")
    dtype = next(model.parameters()).dtype
    kernels_read = dtype in (torch.float32, torch.bfloat16) and head_dim in (64, 128)
    if kv_dtype != dtype or not kernels_read:  # engine/ops/cpu_decode_attention.kernel_fits
        return ThreadPlan(1, f"attention on torch's ops ({kv_dtype} cache): OpenMP's threads")
    return ThreadPlan(threads, f"the kernels on a pool of {threads} threads, torch's ops on one")


def take_threads(model: nn.Module, kv_dtype: torch.dtype, head_dim: int) -> ThreadPlan:
    """Set up the process's threads for this model (see the module doc), and log how."""
    threads = _threads["torch"] or torch.get_num_threads()
    chosen = plan(model, kv_dtype, head_dim, threads)
    if chosen.pool_threads > 1:
        _threads["torch"] = threads
        torch.ops.servebench.set_pool_threads(chosen.pool_threads, SPIN_US)
        torch.set_num_threads(1)
    else:
        give_back()
    logger.info("CPU threads: %s", chosen.reason)
    _taken[:] = [chosen]
    return chosen


def give_back() -> None:
    """An earlier engine's pool stopped and torch's threads as they were before it: for code
    that sets torch's threads itself (a tensor-parallel driver takes its rank's share)."""
    if _threads["torch"]:
        torch.ops.servebench.set_pool_threads(1, SPIN_US)
        torch.set_num_threads(_threads["torch"])
        _threads["torch"] = 0
