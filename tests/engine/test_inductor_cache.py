"""inductor's cache kept apart per ATEN_CPU_CAPABILITY (engine/inductor_cache.py): its FX
graph cache does not key on the variable, and a graph cached under another capability made
the compiled decode attention return inf."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from engine.inductor_cache import separate_cache_per_capability

ROOT = Path(__file__).resolve().parents[2]


def test_a_capability_gets_a_cache_folder_of_its_own() -> None:
    env = {"ATEN_CPU_CAPABILITY": "AVX2"}
    path = separate_cache_per_capability(env)
    assert path is not None and path.endswith("capability_avx2")
    assert env["TORCHINDUCTOR_CACHE_DIR"] == path


def test_nothing_changes_without_the_variable_or_with_the_users_folder() -> None:
    assert separate_cache_per_capability({}) is None
    env = {"ATEN_CPU_CAPABILITY": "avx2", "TORCHINDUCTOR_CACHE_DIR": "/mine"}
    assert separate_cache_per_capability(env) is None and env["TORCHINDUCTOR_CACHE_DIR"] == "/mine"


def test_inductor_compiles_into_it_after_import_engine() -> None:
    code = (
        "import engine\nfrom torch._inductor.runtime.cache_dir_utils import cache_dir\n"
        "print(cache_dir())"
    )
    env = {k: v for k, v in os.environ.items() if k != "TORCHINDUCTOR_CACHE_DIR"}
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env={**env, "ATEN_CPU_CAPABILITY": "avx2"},
        capture_output=True, text=True, timeout=300, check=True,
    )  # fmt: skip
    assert done.stdout.strip().endswith("capability_avx2")
