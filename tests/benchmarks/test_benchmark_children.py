"""benchmarks/vllm_side_by_side.py stopped mid-run left vLLM's EngineCore and workers running
(issue 47). Here a fake `vllm` whose LLM() starts a grandchild stands in for it: however the
benchmark ends, nothing it started is left."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

FAKE_VLLM = """
import os, subprocess, sys, time
from pathlib import Path
__version__ = "fake"
class LLM:
    def __init__(self, **kwargs):
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
        Path(os.environ["GRANDCHILD_PID"]).write_text(str(child.pid))  # an EngineCore
        time.sleep(120)
class SamplingParams:
    pass
"""

PARENT = """
import argparse, pathlib, sys
sys.path.insert(0, {bench!r})
import vllm_side_by_side as v
args = argparse.Namespace(vllm_python=sys.executable, vllm_kv_gb=1, vllm_binding="default")
spec = {{"model_dir": "m", "dtype": "float32", "max_num_seqs": 1,
        "max_num_batched_tokens": 8, "max_model_len": 8, "prompts": [[1]], "lens": [1]}}
v.run_vllm(args, spec, pathlib.Path({work!r}))
"""


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state != "Z"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="process groups, /proc")
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL, signal.SIGINT])
def test_a_stopped_side_by_side_leaves_no_vllm_process(tmp_path: Path, sig: int) -> None:
    (tmp_path / "vllm").mkdir()
    (tmp_path / "vllm" / "__init__.py").write_text(textwrap.dedent(FAKE_VLLM))
    pid_file = tmp_path / "grandchild.pid"
    env = dict(os.environ, GRANDCHILD_PID=str(pid_file))
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), env.get("PYTHONPATH", "")])
    code = PARENT.format(bench=str(ROOT / "benchmarks"), work=str(tmp_path))
    parent = subprocess.Popen([sys.executable, "-c", code], env=env, start_new_session=True)
    grandchild = None
    try:
        deadline = time.monotonic() + 120  # two interpreters import torch on a shared machine
        while not pid_file.is_file() or not pid_file.read_text():
            assert parent.poll() is None and time.monotonic() < deadline, "never started"
            time.sleep(0.1)
        grandchild = int(pid_file.read_text())
        assert _alive(grandchild)
        parent.send_signal(sig)
        parent.wait(timeout=60)
        deadline = time.monotonic() + 60
        while _alive(grandchild) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(grandchild), f"vLLM's stand-in outlived the benchmark ({sig!r})"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(parent.pid, signal.SIGKILL)
        if grandchild is not None and _alive(grandchild):
            os.kill(grandchild, signal.SIGKILL)
