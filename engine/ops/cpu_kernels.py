"""The engine's own CPU kernels: `servebench::linear` and `linear_fp8` (cpu_kernels.cpp; used
by engine/ops/cpu_linear.py), `linear_rows` (a tied LM head kept unpacked: engine/model/
llama.py), `servebench::decode_attention` and `decode_attention_fp8` (cpu_attention.cpp;
engine/ops/cpu_decode_attention.py, attention.py), `servebench::prefill_attention`
(cpu_prefill_attention.cpp; attention.py) and `servebench::linear_bf16`
(cpu_kernels_bf16.cpp: AVX512-BF16 only, compiled for it function by function and refused at
run time on other CPUs; `bf16_available()` says whether this one has it). Their loops run on
a thread pool of their own (cpu_pool.h, `servebench::set_pool_threads`; engine/kernel_pool.py
decides where), else on ATen's threads.

Built by torch's extension builder at first use, once per machine, CPU capability and source
(~12 s here, then loaded from its cache in ~0.1 s), with the flags ATen builds its own vector
kernels with, and registered as torch ops: compiled graphs call them without Python. Where
they cannot be built (no C++ compiler, no ninja) the engine logs one warning and keeps the
paths it had before them; `SERVEBENCH_CPU_KERNELS=0` asks for that.

The build lives in a folder named for what is built (the sources' bytes, the flags, torch's
version), compiled from a copy of the sources inside it: two checkouts of the same source share
one build, two of different sources never rebuild each other's. Builders take an advisory lock
(flock, gone with its process) with a timeout that says what it waits for; torch's own lock file
found under it is a killed builder's, and is removed (torch would wait on it forever)."""

from __future__ import annotations

import fcntl
import functools
import hashlib
import logging
import os
import shutil
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import torch

logger = logging.getLogger(__name__)
BUILT = {"ok": False}  # what `available()` found, for code that dynamo traces
LOCK_TIMEOUT_S = float(os.environ.get("SERVEBENCH_KERNEL_LOCK_TIMEOUT", "600"))
HERE = Path(__file__).parent
SOURCES = tuple(HERE / name for name in ("cpu_kernels.h", "cpu_pool.h", "cpu_kernels.cpp",
                                         "cpu_attention.cpp", "cpu_prefill_attention.cpp",
                                         "cpu_kernels_bf16.cpp"))  # fmt: skip

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


def build_flags(cap: str) -> list[str]:
    flags = ["-O3", "-fopenmp"]  # ATen's parallel_for (where no pool) is OpenMP's
    if cap in ISA_FLAGS:
        flags += [*ISA_FLAGS[cap], f"-DCPU_CAPABILITY_{cap}", f"-DCPU_CAPABILITY={cap}"]
    return flags


def build_directory(sources: Path | Sequence[Path], flags: list[str]) -> Path:
    """The folder for these sources (headers too), these flags and this torch (its version
    and where it is installed: two virtualenvs compile against their own headers, and sharing
    a folder would make each rebuild it in turn), under torch's extension root
    (TORCH_EXTENSIONS_DIR, else torch's default), with the sources copied in."""
    from torch.utils.cpp_extension import get_default_build_root

    sources = [sources] if isinstance(sources, Path) else list(sources)
    key = hashlib.sha256()
    for source in sources:
        key.update(source.name.encode() + b"\0" + source.read_bytes())
    key.update(" ".join([*flags, torch.__version__, str(Path(torch.__file__).parent)]).encode())
    root = os.environ.get("TORCH_EXTENSIONS_DIR") or get_default_build_root()
    folder = Path(root) / f"servebench-{key.hexdigest()[:16]}"
    folder.mkdir(parents=True, exist_ok=True)
    for source in sources:
        copy = folder / source.name
        if not copy.exists() or copy.read_bytes() != source.read_bytes():
            tmp = folder / f".{source.name}.{os.getpid()}"
            shutil.copyfile(source, tmp)
            os.replace(tmp, copy)  # a reader never sees half a file
    return folder


@contextmanager
def build_lock(folder: Path, timeout_s: float = LOCK_TIMEOUT_S) -> Iterator[None]:
    """Hold the folder's build lock; TimeoutError after `timeout_s`, saying who holds it."""
    with open(folder / "servebench.lock", "a+") as f:
        start = time.monotonic()
        said = False
        while True:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                waited = time.monotonic() - start
                if waited > timeout_s:
                    raise TimeoutError(
                        f"another process has been building the CPU kernels in {folder} for over "
                        f"{timeout_s:.0f} s (its pid: {_holder(f)}); set "
                        "SERVEBENCH_KERNEL_LOCK_TIMEOUT to wait longer"
                    ) from None
                if not said and waited > 5:
                    logger.warning("waiting for another process (pid %s) building the CPU "
                                   "kernels in %s", _holder(f), folder)  # fmt: skip
                    said = True
                time.sleep(0.2)
        f.seek(0)
        f.truncate()
        f.write(str(os.getpid()))
        f.flush()
        stale = folder / "lock"  # torch's FileBaton: only a builder killed under our lock left it
        if stale.exists():
            logger.warning("removing a stale build lock left by a killed build: %s", stale)
            stale.unlink(missing_ok=True)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _holder(f: object) -> str:
    try:
        return Path(f.name).read_text().strip() or "unknown"  # type: ignore[attr-defined]
    except OSError:
        return "unknown"


@functools.cache
def available() -> bool:
    """Build (or load) and register the kernels; False if this machine cannot."""
    if os.environ.get("SERVEBENCH_CPU_KERNELS") == "0":
        return False
    cap = torch.backends.cpu.get_cpu_capability()
    flags = build_flags(cap)
    try:
        from torch.utils.cpp_extension import load

        _ninja_on_path()
        folder = build_directory(SOURCES, flags)
        compiled = [str(folder / s.name) for s in SOURCES if s.suffix == ".cpp"]
        with build_lock(folder):
            load(f"servebench_cpu_kernels_{cap.lower()}", compiled, extra_cflags=flags,
                 extra_ldflags=["-fopenmp"], build_directory=str(folder),
                 is_python_module=False)  # fmt: skip
    except Exception as e:
        logger.warning("the engine's CPU kernels could not be built, using torch's: %s", e)
        return False

    @torch.library.register_fake("servebench::linear")
    def _(x: torch.Tensor, blocks: torch.Tensor, out_features: int) -> torch.Tensor:
        return x.new_empty(x.shape[0], out_features)

    @torch.library.register_fake("servebench::linear_fp8")
    def _(x: torch.Tensor, blocks: torch.Tensor, scales: torch.Tensor, n: int) -> torch.Tensor:
        return x.new_empty(x.shape[0], n)

    @torch.library.register_fake("servebench::linear_bf16")
    def _(x: torch.Tensor, blocks: torch.Tensor, out_features: int) -> torch.Tensor:
        return x.new_empty(x.shape[0], out_features)

    @torch.library.register_fake("servebench::linear_rows")
    def _(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return x.new_empty(x.shape[0], w.shape[0])

    @torch.library.register_fake("servebench::decode_attention_fp8")
    def _(q: torch.Tensor, *_: object) -> torch.Tensor:
        return torch.empty_like(q)

    @torch.library.register_fake("servebench::decode_attention")
    def _(q: torch.Tensor, *_: object) -> torch.Tensor:
        return torch.empty_like(q)

    @torch.library.register_fake("servebench::prefill_attention")
    def _(q: torch.Tensor, *_: object) -> torch.Tensor:
        return torch.empty_like(q)

    BUILT["ok"] = True
    return True


def bf16_available() -> bool:
    """Whether `servebench::linear_bf16` runs here: the kernels built and the CPU has
    AVX512-BF16 (asked of the CPU by the kernel itself, which checks again on each call).
    SERVEBENCH_BF16_KERNEL=0 says no: bf16 linears then run torch's product, as before."""
    if os.environ.get("SERVEBENCH_BF16_KERNEL") == "0":
        return False
    return _cpu_runs_bf16_kernel()


@functools.cache
def _cpu_runs_bf16_kernel() -> bool:
    return available() and bool(torch.ops.servebench.has_bf16_kernel())
