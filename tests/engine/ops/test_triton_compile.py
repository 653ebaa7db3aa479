"""The Triton kernels compile for a real GPU (sm_90), checked without one: the interpreter
runs Python, so code it accepts may still fail to compile (types of loop-carried values,
tl.dot shapes, constexpr branches). compile_triton_kernels.py, beside this file, does the
compiling."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")


def test_every_kernel_compiles_for_sm90() -> None:
    script = Path(__file__).with_name("compile_triton_kernels.py")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         timeout=600, env=env, cwd=script.parent.parent)  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr[-3000:]
    assert run.stdout.count("ok   ") == 12, run.stdout
