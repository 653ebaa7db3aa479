"""Measuring any server must not need torch (issue 42): `bench run --base-url` against a
server of known timing, in a process where importing torch fails, with the arrival check of a
gamma schedule (its CDF was torch's incomplete gamma) and the report."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

BLOCK_TORCH = """
import importlib.abc, sys

class NoTorch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in ("torch", "triton"):
            raise ImportError(f"torch is not installed here ({name})")

sys.meta_path.insert(0, NoTorch())
from bench_cli.app import app
app(sys.argv[1:])
"""


def test_bench_run_against_a_server_needs_no_torch(
    tmp_path: Path, mock_server: Callable[..., str]
) -> None:
    url = mock_server("--ttft", "0.01", "--itl", "0.002")
    out = tmp_path / "run"
    args = ["run", "--base-url", url, "--model", "mock", "--num-requests", "12"]
    args += ["--arrival", "gamma", "--rate", "30", "--burstiness", "0.5", "--warmup", "0"]
    args += ["--no-dashboard", "--max-p99-lag-ms", "1000", "--out", str(out)]
    done = subprocess.run(
        [sys.executable, "-c", BLOCK_TORCH, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["completed"] == 12
    assert summary["arrival_check"]["ks_vs_target"]["p_value"] is not None  # gamma CDF ran
    assert (out / "report.html").is_file()
