"""`bench sweep --num-requests/--duration/--rate` change a profile's load without a copy of
its TOML (issue 45); a flag that names one of the sweep's axes is refused, not overridden
by the axis without a word."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pandas as pd
from typer.testing import CliRunner

from bench_cli.app import app

PROFILE = """
name = "flags"
num_requests = 16
warmup = 0
input_len = "16"
output_len = "4"
max_p99_lag_ms = 1000.0  # what the flags do, on a busy machine too (INVALID: test_sweep_invalid)

[sweep]
rate = [50, 100]
"""


def _sweep(tmp: Path, *args: str) -> tuple[int, str]:
    (tmp / "p.toml").write_text(PROFILE)
    cmd = ["sweep", "--profile", str(tmp / "p.toml"), "--out", str(tmp / "s"), "--no-dashboard"]
    result = CliRunner().invoke(app, [*cmd, *args])
    return result.exit_code, result.output


def test_num_requests_flag_sets_every_points_requests(
    tmp_path: Path, mock_server: Callable[..., str]
) -> None:
    url = mock_server("--ttft", "0.001", "--itl", "0.001")
    rc, out = _sweep(tmp_path, "--base-url", url, "--num-requests", "3")
    assert rc == 0, out
    table = pd.read_csv(tmp_path / "s" / "sweep.csv")
    assert list(table["rate"]) == [50, 100] and list(table["completed"]) == [3, 3]
    for point in (p for p in (tmp_path / "s").iterdir() if p.is_dir()):
        assert json.loads((point / "config.json").read_text())["run"]["num_requests"] == 3


def test_a_flag_naming_a_sweep_axis_is_refused(tmp_path: Path) -> None:
    rc, out = _sweep(tmp_path, "--base-url", "http://127.0.0.1:9/v1", "--rate", "5")
    assert rc == 2 and "--rate" in out and "--rates" in out
    assert not (tmp_path / "s").exists()
    rc, out = _sweep(tmp_path, "--rates", "auto:3", "--duration", "2")
    assert rc == 2 and "num_requests" in out
