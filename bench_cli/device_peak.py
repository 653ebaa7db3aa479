"""This device's achievable peak (matmul FLOP/s, copy and read bandwidth), measured in a few
seconds and cached per machine, so every run's utilization is against the same yardstick and
no run pays for measuring it again. The cache is a JSON file in $SERVEBENCH_CACHE_DIR (default
~/.cache/servebench); delete it to measure again (after a hardware or driver change)."""

from __future__ import annotations

import json
import math
import os
import platform
import time
from pathlib import Path
from typing import Any

import torch


def _best_time(fn: Any, sync: Any, repeats: int) -> float:
    fn()  # warm-up: allocation, thread pool, kernel selection
    sync()
    best = math.inf
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        sync()
        best = min(best, time.perf_counter() - t0)
    return best


def measure_peak(
    device: str = "cpu", dtype: torch.dtype = torch.float32, n: int | None = None, repeats: int = 5
) -> dict[str, Any]:
    """The achievable peak of this device, measured in a few seconds: dense matmul FLOP/s
    (best of `repeats` square torch.matmul of side n: 2n^3 FLOPs) and memory bandwidth (best of
    `repeats` copies of a 256 MiB tensor on CUDA, 64 MiB on CPU: bytes read + written per s)
    and read bandwidth (a sum over 1 GiB on CUDA, 256 MiB on CPU: bytes read per s).

    A CPU has no spec-sheet peak to divide by, so here "peak" is the best torch matmul and copy
    this machine does now (with torch's current thread count): utilization is relative to that,
    not to a vendor number, and a busy machine lowers peak and achieved alike. On CUDA the
    same measurement is also below the spec sheet (typically 70-90 % of it for matmul).
    Returns peak_flops (FLOP/s), peak_bytes_per_s, peak_read_bytes_per_s, matmul_n, device,
    dtype, threads."""
    dev = torch.device(device)
    cuda = dev.type == "cuda"
    n = n or (8192 if cuda else 1024)
    sync = (lambda: torch.cuda.synchronize(dev)) if cuda else (lambda: None)
    a = torch.randn(n, n, device=dev).to(dtype)
    b = torch.randn(n, n, device=dev).to(dtype)
    t_mm = _best_time(lambda: torch.matmul(a, b), sync, repeats)
    elems = (256 if cuda else 64) * 2**20 // 4
    src = torch.ones(elems, device=dev, dtype=torch.float32)
    dst = torch.empty_like(src)
    t_copy = _best_time(lambda: dst.copy_(src), sync, repeats)
    # Reading alone (a sum), from a tensor 8x this CPU's 32 MiB L3: how weights stream in a
    # decode step, which reads every weight and writes next to nothing.
    big = torch.ones((1024 if cuda else 256) * 2**20 // 4, device=dev, dtype=torch.float32)
    t_read = _best_time(lambda: big.sum(), sync, repeats)
    return {
        "peak_flops": 2.0 * n**3 / t_mm,
        "peak_bytes_per_s": 2.0 * elems * 4 / t_copy,
        "peak_read_bytes_per_s": big.numel() * 4 / t_read,
        "matmul_n": n,
        "device": str(dev),
        "dtype": str(dtype).removeprefix("torch."),
        "threads": torch.get_num_threads(),
    }


def cache_path() -> Path:
    root = os.environ.get("SERVEBENCH_CACHE_DIR") or Path.home() / ".cache" / "servebench"
    return Path(root) / "device_peak.json"


def _machine_key(device: torch.device, dtype: torch.dtype) -> str:
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
    else:
        name = platform.processor() or platform.machine()
    threads = torch.get_num_threads()
    return (
        f"{platform.node()} | {device.type} {name} | {str(dtype).removeprefix('torch.')} | "
        f"{threads} threads | torch {torch.__version__}"
    )


def local_sim_peak(dtype: str | None = "auto") -> dict[str, Any]:
    """This machine's peaks in the dtype a simulated local engine computes in: "auto" as the
    engine resolves it (bfloat16 where the CPU has it natively, else float32)."""
    from engine.resolve import resolve_dtype

    name = resolve_dtype(dtype or "auto", torch.device("cpu"))
    return device_peak("cpu", torch.bfloat16 if name == "bfloat16" else torch.float32)


def device_peak(device: str = "cpu", dtype: torch.dtype = torch.float32) -> dict[str, Any]:
    """measure_peak's figures for this machine, device and dtype, from the cache when it has
    them ("cached": true, with "measured_at"), else measured now and stored."""
    from engine.kernel_pool import machine_threads

    with machine_threads():  # an in-process engine's pool holds torch at one thread
        return _device_peak(torch.device(device), dtype)


def _device_peak(dev: torch.device, dtype: torch.dtype) -> dict[str, Any]:
    device = str(dev)
    key = _machine_key(dev, dtype)
    path = cache_path()
    try:
        cached = json.loads(path.read_text())
    except (OSError, ValueError):
        cached = {}
    if key in cached:
        return cached[key] | {"cached": True}
    peak = measure_peak(device, dtype) | {"machine": key, "measured_at": time.time()}
    cached[key] = peak
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(cached, indent=1))
        tmp.replace(path)
    except OSError:
        pass  # a read-only home: measured every run, still recorded in each run's config
    return peak | {"cached": False}
