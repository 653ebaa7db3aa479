"""The engine's own CPU kernels (cpu_kernels.cpp): `servebench::linear` and `linear_fp8`
(engine/ops/cpu_linear.py), `linear_rows` (a tied LM head kept unpacked: engine/model/
llama.py) and `servebench::decode_attention` and `decode_attention_fp8` (engine/ops/
cpu_decode_attention.py, attention.py).

Built by torch's extension builder at first use, once per machine, CPU capability and source
(~12 s here, then loaded from its cache in ~0.1 s), with the flags ATen builds its own vector
kernels with, and registered as torch ops: compiled graphs call them without Python. Where
they cannot be built (no C++ compiler, no ninja) the engine logs one warning and keeps the
paths it had before them; `SERVEBENCH_CPU_KERNELS=0` asks for that."""

from __future__ import annotations

import functools
import logging
import os
from pathlib import Path

import torch

logger = logging.getLogger(__name__)
BUILT = {"ok": False}  # what `available()` found, for code that dynamo traces

# What ATen compiles its vector kernels with for each CPU capability (its vec types need them).
ISA_FLAGS = {
    "AVX2": ["-mavx2", "-mfma", "-mbmi", "-mbmi2", "-mf16c"],
    "AVX512": ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mfma"],
}


def _ninja_on_path() -> None:
    """torch's builder runs `ninja` from PATH: the pip package's binary is in the venv's bin,
    which is not on PATH when the venv's python runs unactivated (as `make test` does)."""
    try:
        import ninja
    except ImportError:
        return  # a ninja of the system's, if any
    path = os.environ.get("PATH", "")
    if ninja.BIN_DIR not in path.split(os.pathsep):
        os.environ["PATH"] = os.pathsep.join(p for p in (ninja.BIN_DIR, path) if p)


@functools.cache
def available() -> bool:
    """Build (or load) and register the kernels; False if this machine cannot."""
    if os.environ.get("SERVEBENCH_CPU_KERNELS") == "0":
        return False
    cap = torch.backends.cpu.get_cpu_capability()
    flags = ["-O3", "-fopenmp"]  # at::parallel_for is OpenMP's: torch's own thread pool
    if cap in ISA_FLAGS:
        flags += [*ISA_FLAGS[cap], f"-DCPU_CAPABILITY_{cap}", f"-DCPU_CAPABILITY={cap}"]
    try:
        from torch.utils.cpp_extension import load

        _ninja_on_path()
        source = Path(__file__).with_suffix(".cpp")
        load(f"servebench_cpu_kernels_{cap.lower()}", [str(source)], extra_cflags=flags,
             extra_ldflags=["-fopenmp"], is_python_module=False)  # fmt: skip
    except Exception as e:
        logger.warning("the engine's CPU kernels could not be built, using torch's: %s", e)
        return False

    @torch.library.register_fake("servebench::linear")
    def _(x: torch.Tensor, blocks: torch.Tensor, out_features: int) -> torch.Tensor:
        return x.new_empty(x.shape[0], out_features)

    @torch.library.register_fake("servebench::linear_fp8")
    def _(x: torch.Tensor, blocks: torch.Tensor, scales: torch.Tensor, n: int) -> torch.Tensor:
        return x.new_empty(x.shape[0], n)

    @torch.library.register_fake("servebench::linear_rows")
    def _(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return x.new_empty(x.shape[0], w.shape[0])

    @torch.library.register_fake("servebench::decode_attention_fp8")
    def _(q: torch.Tensor, *_: object) -> torch.Tensor:
        return torch.empty_like(q)

    @torch.library.register_fake("servebench::decode_attention")
    def _(q: torch.Tensor, *_: object) -> torch.Tensor:
        return torch.empty_like(q)

    BUILT["ok"] = True
    return True
