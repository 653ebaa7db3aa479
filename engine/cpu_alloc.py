"""Keep freed activation buffers in glibc's heap instead of handing them back to the OS.

With glibc's defaults each multi-MB activation of a step is a fresh mmap, so every step
pays page faults on all of it (figures: docs/results/2026-12-04-cpu-design-choices.md). It only
helps when set before torch allocates (set from LLMEngine.__init__ it did nothing), hence at
`import engine`. vLLM's CPU guide gets the same effect by preloading tcmalloc.

`SERVEBENCH_MALLOPT=0` leaves the allocator alone."""

from __future__ import annotations

import ctypes
import os
import sys

M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_THRESHOLD = -1, -2, -3


def keep_freed_memory_in_heap() -> bool:
    if os.environ.get("SERVEBENCH_MALLOPT") == "0" or not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:  # not glibc (musl, ...)
        return False
    ok = libc.mallopt(M_MMAP_THRESHOLD, 32 * 2**20)  # glibc's maximum; stops its auto-tuning
    ok &= libc.mallopt(M_TRIM_THRESHOLD, 2**30)
    ok &= libc.mallopt(M_TOP_PAD, 256 * 2**20)
    return bool(ok)
