"""How many OpenMP parallel regions a decode step runs: each is a barrier that waits for
the slowest of torch's threads, so beside another process each is a chance to wait for a
descheduled one (docs/results/2026-12-06-contention.md).

    python benchmarks/omp_regions.py                 # B = 1 and 8, float32 (and bf16 if native)
    python benchmarks/omp_regions.py --batch 32 --dtype bfloat16

It builds a small shim (gcc) that counts calls of libgomp's GOMP_parallel, reruns itself with
the shim preloaded, and prints regions per decode step, from every caller at once: ATen's
at::parallel_for, the engine's kernels and the C++ of inductor's compiled graphs."""

from __future__ import annotations

import argparse
import ctypes
import os
import subprocess
import sys
import tempfile
from pathlib import Path

SHIM = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdatomic.h>
static atomic_long regions;
typedef void (*parallel_t)(void (*)(void *), void *, unsigned, unsigned);
void GOMP_parallel(void (*fn)(void *), void *data, unsigned threads, unsigned flags) {
  static parallel_t real;
  if (!real) real = (parallel_t)dlsym(RTLD_NEXT, "GOMP_parallel");
  atomic_fetch_add(&regions, 1);
  real(fn, data, threads, flags);
}
long servebench_omp_regions(void) { return atomic_load(&regions); }
"""


def count(args: argparse.Namespace, shim: str) -> None:
    # isort: off
    import engine  # noqa: F401 (first: allocator and wait policy before torch)

    # isort: on
    from bf16_decode import setup

    counter = ctypes.CDLL(shim).servebench_omp_regions
    counter.restype = ctypes.c_long
    for dtype in args.dtype:
        for batch in args.batch:
            path = "float32" if dtype == "float32" else "bf16-kernel"
            eng = setup(args.model, path, batch, args.context, args.steps + 4)
            before = counter()
            for _ in range(args.steps):
                eng.step()
            per_step = (counter() - before) / args.steps
            print(f"{dtype:<9} B={batch:<3} {per_step:6.1f} parallel regions per decode step")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    p.add_argument("--dtype", nargs="+")
    p.add_argument("--context", type=int, default=128)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--shim", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.shim:
        return count(args, args.shim)
    if not args.dtype:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from noisy_neighbour import fast_dtypes

        args.dtype = fast_dtypes()
    with tempfile.TemporaryDirectory() as tmp:
        src, lib = Path(tmp, "shim.c"), Path(tmp, "libompcount.so")
        src.write_text(SHIM)
        subprocess.run(["gcc", "-O2", "-shared", "-fPIC", src, "-o", lib, "-ldl"], check=True)
        env = dict(os.environ, LD_PRELOAD=str(lib))
        cmd = [sys.executable, __file__, "--shim", str(lib), "--model", args.model]
        cmd += ["--context", str(args.context), "--steps", str(args.steps)]
        cmd += ["--batch", *map(str, args.batch), "--dtype", *args.dtype]
        sys.exit(subprocess.run(cmd, env=env).returncode)


if __name__ == "__main__":
    main()
