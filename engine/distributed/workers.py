"""The driver's side of tensor parallelism: start the worker processes, join their group as
rank 0, check they are alive before each step, and stop them."""

from __future__ import annotations

import contextlib
import os
import pickle
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from engine import kernel_pool
from engine.distributed.group import TPGroup

if TYPE_CHECKING:
    from engine.config import EngineConfig


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def threads_per_rank(size: int) -> int:
    """Each rank's share of this process's cores."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, (cores or 1) // size)


class TPWorkers:
    """Ranks 1..size-1, each a `python -m engine.distributed.worker` process."""

    def __init__(self, config: Any, kv_scales: Any, size: int, device: torch.device) -> None:
        if dist.is_initialized():
            raise RuntimeError(
                "a tensor-parallel engine is already running in this process: shut it down "
                "(LLMEngine.shutdown) before starting another"
            )
        self.size = size
        port = _free_port()
        self._dir = tempfile.TemporaryDirectory(prefix="servebench-tp-")
        setup = Path(self._dir.name) / "setup.pkl"
        setup.write_bytes(pickle.dumps((config, kv_scales)))
        threads = threads_per_rank(size)
        self.procs = [
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "engine.distributed.worker",
                    "--rank",
                    str(rank),
                    "--size",
                    str(size),
                    "--port",
                    str(port),
                    "--setup",
                    str(setup),
                    "--threads",
                    str(threads),
                ],
                env={**os.environ, "OMP_NUM_THREADS": str(threads)},
            )
            for rank in range(1, size)
        ]
        kernel_pool.give_back()  # an earlier engine's pool would make rank 0 its own count
        torch.set_num_threads(threads)  # the driver is rank 0: its share too
        self.group: TPGroup | None = TPGroup(0, size, port, device)

    def wait_ready(self) -> None:
        """After rank 0's own shard is built: every worker's, or the first error."""
        errors: list[str | None] = [None] * self.size
        dist.gather_object(None, errors, dst=0)
        failed = [f"rank {r}: {e}" for r, e in enumerate(errors) if e]
        if failed:
            self.stop()
            raise RuntimeError("tensor-parallel workers failed to start: " + "; ".join(failed))

    def check_alive(self) -> None:
        for rank, proc in enumerate(self.procs, start=1):
            code = proc.poll()
            if code is not None:
                raise RuntimeError(
                    f"tensor-parallel worker rank {rank} exited with code {code}; the engine "
                    "cannot run steps without it (restart it)"
                )

    def stop(self) -> None:
        """Tell the workers to stop, wait a little, then kill what is left. The driver's end
        of the group closes after the workers have gone: closed first, a worker still leaving
        its collective can find the connection cut and abort (seen on a busy machine)."""
        if self.group is not None and all(p.poll() is None for p in self.procs):
            with contextlib.suppress(Exception):
                self.group.broadcast(("stop",))
        elif self.group is not None:  # a worker gone mid-collective: cut the rest off
            self.group.destroy()
            self.group = None
        for proc in self.procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if self.group is not None:
            self.group.destroy()
            self.group = None
        self._dir.cleanup()


def check_tensor_parallel(config: EngineConfig, device: torch.device) -> None:
    """Refuse what tensor parallelism does not support, before any worker starts."""
    n = config.tensor_parallel_size
    if config.cuda_graphs:
        raise ValueError("cuda_graphs with tensor_parallel_size > 1 is not supported")
    if device.type == "cuda" and torch.cuda.device_count() < n:
        raise ValueError(
            f"tensor_parallel_size={n} needs {n} GPUs; {torch.cuda.device_count()} visible"
        )
