"""What `dtype="auto"` becomes, and why: bfloat16 on CUDA; on a CPU, float32 where bf16 has no
native instructions (AVX2-only x86: bf16 matmuls ~500x slower there, whatever a measurement
says), else whichever of the two runs a decode-shaped linear faster on this machine.

The measurement takes a few ms: one [1, 576] x [576, 1536] product (SmolLM2's FFN width at one
sequence, where decode spends its time) in each dtype, through the path that dtype's linears
would run (the engine's kernels where built, else torch's), best of a few alternating tries.
Its result is cached per machine and kernels (CPU model, CPU flags, torch version, the kernels'
sources) beside the kernels' build (torch's extension folder), so later starts read it
instead; new kernel sources measure again."""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

import torch

logger = logging.getLogger(__name__)

SHAPE = (1, 576, 1536)  # rows, in, out: a decode-step linear
TRIES = 5


@dataclass(frozen=True, slots=True)
class DtypeChoice:
    dtype: str  # "bfloat16" or "float32"
    reason: str  # one line: why, with the timings where measured


def cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith(("flags", "Features")):
            return set(line.split(":", 1)[1].split())
    return set()


def cpu_has_native_bf16() -> bool:
    """x86 AVX512-BF16 or AMX, or ARM BF16: the CPUs where bf16 matmuls run natively.
    SERVEBENCH_CPU_BF16=0 says no (dtype auto is then float32, as on AVX2 machines: the test
    suite sets it, so which dtype its exactness tests check does not depend on the CPU)."""
    if os.environ.get("SERVEBENCH_CPU_BF16") == "0":
        return False
    return bool(cpu_flags() & {"avx512_bf16", "amx_bf16", "bf16"})


def machine_key() -> str:
    """What a cached measurement holds for: the CPU's model and flags, torch's version and the
    kernels' sources."""
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    from engine.ops.cpu_kernels import SOURCES

    key = hashlib.sha256(
        "\n".join([model, " ".join(sorted(cpu_flags())), torch.__version__]).encode()
    )
    for source in SOURCES:  # the kernels timed: a new source may change which dtype wins
        key.update(source.read_bytes())
    return key.hexdigest()[:16]


def cache_file() -> Path:
    """In torch's extension folder, where the kernels are built (TORCH_EXTENSIONS_DIR, as
    torch's builder reads it, else its default)."""
    from torch.utils.cpp_extension import get_default_build_root

    root = os.environ.get("TORCH_EXTENSIONS_DIR") or get_default_build_root()
    return Path(root) / f"servebench-dtype-{machine_key()}.json"


def decode_linear_ms() -> dict[str, float]:
    """Best-of-TRIES milliseconds of one decode-shaped linear per dtype, tries alternating,
    through the path each dtype's model would run (engine/ops/cpu_linear.py)."""
    from engine.ops.cpu_linear import PackedLinear, packing_enabled

    rows, k, n = SHAPE
    gen = torch.Generator().manual_seed(0)
    w, x = torch.randn(n, k, generator=gen) * 0.05, torch.randn(rows, k, generator=gen)
    fns = {}
    for name, dtype in (("float32", torch.float32), ("bfloat16", torch.bfloat16)):
        if packing_enabled(dtype, torch.device("cpu")):
            fns[name] = functools.partial(PackedLinear(w.to(dtype)), x.to(dtype))
        else:
            fns[name] = functools.partial(torch.nn.functional.linear, x.to(dtype), w.to(dtype))
    best = dict.fromkeys(fns, float("inf"))
    with torch.inference_mode():
        for fn in fns.values():
            fn()  # first calls pay for allocation, oneDNN's set-up
        for _ in range(TRIES):
            for name, fn in fns.items():
                t0 = time.perf_counter()
                fn()
                best[name] = min(best[name], (time.perf_counter() - t0) * 1e3)
    return best


def cached_or_measured() -> tuple[dict[str, float], str]:
    """This machine's timings and where they came from ("measured" or the cache's path)."""
    path = cache_file()
    try:
        timings = json.loads(path.read_text())["decode_linear_ms"]
        if set(timings) == {"float32", "bfloat16"}:
            return {k: float(v) for k, v in timings.items()}, f"cached in {path}"
    except (OSError, ValueError, KeyError, TypeError):
        pass
    timings = decode_linear_ms()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"decode_linear_ms": timings, "shape": SHAPE}))
        os.replace(tmp, path)
    except OSError as e:
        logger.warning("could not cache the dtype measurement in %s: %s", path, e)
    return timings, "measured now"


def choose_dtype(
    device: torch.device,
    native_bf16: bool | None = None,
    timings: dict[str, float] | None = None,
) -> DtypeChoice:
    """What 'auto' is on `device`. `native_bf16` and `timings` ({"float32": ms, "bfloat16":
    ms}) are this machine's unless given (tests inject them)."""
    if device.type == "cuda":
        return DtypeChoice("bfloat16", "CUDA: bf16 tensor cores")
    native = cpu_has_native_bf16() if native_bf16 is None else native_bf16
    if not native:
        return DtypeChoice("float32", "this CPU has no native bf16 (bf16 matmuls are emulated)")
    source = "given"
    if timings is None:
        timings, source = cached_or_measured()
    f32, bf16 = timings["float32"], timings["bfloat16"]
    pick = "bfloat16" if bf16 < f32 else "float32"
    return DtypeChoice(
        pick,
        f"a decode-shaped linear {SHAPE[0]}x{SHAPE[1]}x{SHAPE[2]} took {bf16:.3f} ms in bf16, "
        f"{f32:.3f} ms in float32 ({source})",
    )
