"""Compiled code kept apart per CPU capability when ATEN_CPU_CAPABILITY picks one.

inductor honours ATEN_CPU_CAPABILITY when it generates vector code, but its FX graph cache
does not key on it: on an AVX-512 CPU, a graph cached in a plain run was loaded under
ATEN_CPU_CAPABILITY=avx2, and the compiled decode attention returned inf (the engine's
warm-up check refused to start; torch 2.13, docs/results/2026-12-07-avx2-paths.md).
With the variable set and no TORCHINDUCTOR_CACHE_DIR of the user's, inductor's cache goes to
a folder of that capability's own beside its default one. inductor reads the variable when it
first compiles, so setting it at `import engine` is early enough."""

from __future__ import annotations

import getpass
import os
import re
import tempfile
from collections.abc import MutableMapping


def separate_cache_per_capability(env: MutableMapping[str, str] = os.environ) -> str | None:
    """The cache folder chosen, or None where nothing was changed."""
    capability = env.get("ATEN_CPU_CAPABILITY", "").strip().lower()
    if not capability or "TORCHINDUCTOR_CACHE_DIR" in env:
        return None
    try:
        user = re.sub(r'[\\/:*?"<>|]', "_", getpass.getuser())
    except (KeyError, OSError):  # no name for this uid (some containers)
        user = str(os.getuid()) if hasattr(os, "getuid") else "user"
    safe = re.sub(r"[^a-z0-9_]", "_", capability)
    path = os.path.join(tempfile.gettempdir(), f"torchinductor_{user}", f"capability_{safe}")
    env["TORCHINDUCTOR_CACHE_DIR"] = path
    return path
