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
import argparse, pathlib, signal, sys
# Ctrl-C as a terminal delivers it, whatever the suite inherited: a shell's background job
# (`cmd &` in a script, nohup) starts with SIGINT ignored, and so would this process.
signal.signal(signal.SIGINT, signal.default_int_handler)
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


# A child that can start children of its own (bench run starts bench serve; vLLM an
# EngineCore) goes through child_procs; these calls start nothing that outlives them.
LEAF_CHILDREN = {
    ("omp_regions.py", "run"),  # gcc, then the measured script in the foreground
    ("vllm_side_by_side.py", "run"),  # pip installs of --setup-vllm-env
    ("noisy_neighbour.py", "Popen"),  # its own group and stop_group, like child_procs
    ("noisy_neighbour.py", "run"),  # `python -c "import vllm"`
    ("llamacpp_side_by_side.py", "Popen"),  # the engine side: own group, stop_group
    ("llamacpp_tools.py", "run"),  # set-up: pip, cmake, llama-quantize, --version
}


def test_benchmarks_start_children_that_start_children_through_child_procs() -> None:
    import ast

    found = []
    for path in sorted((ROOT / "benchmarks").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                continue
            func = node.func
            starts = func.attr in ("run", "Popen", "call", "check_call", "check_output")
            if starts and isinstance(func.value, ast.Name) and func.value.id == "subprocess":
                found.append((path.name, func.attr, node.lineno))
    unchecked = [f for f in found if f[:2] not in LEAF_CHILDREN and f[0] != "child_procs.py"]
    assert not unchecked, f"use child_procs.run_group / group_child: {unchecked}"


def test_run_group_is_subprocess_run_with_the_group_stopped() -> None:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from child_procs import run_group

    done = run_group([sys.executable, "-c", "print('hi')"], capture_output=True, text=True)
    assert (done.returncode, done.stdout) == (0, "hi\n")
    with pytest.raises(subprocess.CalledProcessError):
        run_group([sys.executable, "-c", "raise SystemExit(3)"], check=True)
    with pytest.raises(subprocess.TimeoutExpired):
        run_group([sys.executable, "-c", "import time; time.sleep(30)"], timeout=0.5)
