"""`bench sweep --ray-address`: the points at once as Ray tasks on a local Ray instance, their
files gathered into the sweep folder a serial sweep writes; what cannot run at once refused
before anything starts. Skipped, saying so, where ray is not installed (servebench[ray])."""

from __future__ import annotations

import io
import json
import sys
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pandas as pd
import pytest
from rich.console import Console

from bench_cli.sweep.options import SweepOptions
from bench_cli.sweep.ray import resources
from bench_cli.sweep.runner import run_sweep
from bench_cli.sweep.serve_cmd import ServeCommand

LOAD_ONLY = """
name = "par"
model = "mock"
tokenizer = "smollm2-135m"
num_requests = 8
warmup = 1
input_len = "8"
output_len = "4"
max_p99_lag_ms = 1000.0

[sweep]
rate = [20, 40]
"""


def sweep(
    tmp: Path, profile: str, base_url: str | None, ray: str | None, **kw: Any
) -> tuple[int, str]:
    path = tmp / "profile.toml"
    path.write_text(profile)
    buf = io.StringIO()
    flags = {"base_url": base_url, "model": None, "api_key": None, "name": None}
    flags["out"] = str(tmp / kw.pop("out", "sweep"))
    options = SweepOptions(ray_address=ray, **kw)
    rc = run_sweep(str(path), flags, options, Console(file=buf, width=160))
    return rc, " ".join(buf.getvalue().split())


def _files(folder: Path) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()}


def test_a_load_only_sweep_on_ray_writes_the_folder_a_serial_sweep_writes(
    local_ray: None, tmp_path: Path, mock_server: Callable[..., str]
) -> None:
    url = mock_server("--ttft", "0.01", "--itl", "0.002")
    rc, printed = sweep(tmp_path, LOAD_ONLY, url, "local", out="ray")
    assert rc == 0, printed
    assert "2 runs as Ray tasks on local" in printed
    assert "every point loads" in printed and "at the same time" in printed
    rc, serial = sweep(tmp_path, LOAD_ONLY, url, None, out="serial")
    assert rc == 0, serial
    ray_dir, serial_dir = tmp_path / "ray", tmp_path / "serial"
    assert _files(ray_dir) - {"sweep.json"} == _files(serial_dir) - {"sweep.json"}
    table, serial_table = pd.read_csv(ray_dir / "sweep.csv"), pd.read_csv(serial_dir / "sweep.csv")
    assert list(table.columns) == list(serial_table.columns)
    assert list(table["rate"]) == [20, 40] and list(table["completed"]) == [8, 8]
    for point in ("p00-rate-20", "p01-rate-40"):
        config = json.loads((ray_dir / point / "config.json").read_text())
        assert config["run"]["out"] == str(ray_dir / point), "the driver's folder, not the task's"
        summary = json.loads((ray_dir / point / "summary.json").read_text())
        assert any("served their loads too" in w for w in summary["warnings"])
        lines = (ray_dir / point / "requests.jsonl").read_text().splitlines()
        assert len(lines) == 9  # 8 measured, 1 warm-up
    assert json.loads((ray_dir / "sweep.json").read_text())["ray_address"] == "local"
    assert (ray_dir / "report.html").is_file()


MOCK = f"{sys.executable} -m loadgen.mock_server --port {{port}} --tag {{tag}} --ttft 0.01"
SERVED = """
name = "cmd"
model = "mock"
tokenizer = "smollm2-135m"
num_requests = 6
warmup = 0
input_len = "8"
output_len = "4"
concurrency = 2

[sweep]
tag = ["a", "b"]
"""


def test_a_serve_cmd_sweep_on_ray_starts_each_points_server_on_its_own_port(
    local_ray: None, tmp_path: Path
) -> None:
    rc, printed = sweep(tmp_path, SERVED, None, "local", serve=ServeCommand(MOCK, ready_timeout=60))
    assert rc == 0, printed
    assert "every point loads" not in printed  # each its own server
    table = pd.read_csv(tmp_path / "sweep" / "sweep.csv")
    assert list(table["tag"]) == ["a", "b"] and list(table["completed"]) == [6, 6]
    ports = set()
    for point, tag in (("p00-tag-a", "a"), ("p01-tag-b", "b")):
        ran = json.loads((tmp_path / "sweep" / point / "server.json").read_text())
        assert ran["cmd"][ran["cmd"].index("--tag") + 1] == tag
        ports.add(ran["cmd"][ran["cmd"].index("--port") + 1])
        assert (tmp_path / "sweep" / point / "server.log").is_file()
        config = json.loads((tmp_path / "sweep" / point / "config.json").read_text())
        assert config["server"]["kind"] == "servebench"
    assert len(ports) == 2


@pytest.mark.parametrize(
    ("profile", "kw", "said"),
    [
        (LOAD_ONLY, {"rates": "auto:4"}, "--ray-address with --rates auto:N"),
        (LOAD_ONLY.replace("[sweep]\nrate = [20, 40]", ""), {"search": "1:4"}, "--slo-search"),
        (
            'model = "tiny-smollm2"\nin_process = true\n' + LOAD_ONLY.split("\n", 3)[3],
            {},
            "--in-process",
        ),
    ],
)
def test_what_cannot_run_at_once_is_refused_before_anything_starts(
    tmp_path: Path, profile: str, kw: dict, said: str
) -> None:
    url = None if "in_process" in profile else "http://127.0.0.1:9/v1"
    if url:
        profile = profile.replace('model = "mock"', 'model = "mock"\nslo = "ttft=1"')
    rc, printed = sweep(tmp_path, profile, url, "local", **kw)
    assert rc == 2 and said in printed, printed
    assert not list((tmp_path / "sweep").glob("p*"))


def test_a_point_asks_a_cpu_a_load_process_and_a_gpu_for_its_server_where_there_are() -> None:
    external = SimpleNamespace(base_url="http://h/v1", engine_kind=None, workers=3)
    assert resources(external, None, 8) == {"num_cpus": 3, "num_gpus": 0}
    bundled = SimpleNamespace(base_url=None, engine_kind=None, workers=1)
    assert resources(bundled, None, 8) == {"num_cpus": 1, "num_gpus": 1}
    assert resources(bundled, None, 0) == {"num_cpus": 1, "num_gpus": 0}
    assert resources(external, object(), 2)["num_gpus"] == 1  # --serve-cmd starts one


def test_ctrl_c_stops_every_points_task_and_server(local_ray: None, tmp_path: Path) -> None:
    """The driver cancels the tasks; each stops its server on the way out (Ray's cancel is a
    SIGINT in the task, which its run takes as Ctrl-C)."""
    import os
    import signal
    import subprocess
    import time

    import psutil

    marker = f"m{os.getpid()}x{time.monotonic_ns()}"  # this test's servers, by their --tag
    slow = SERVED.replace("num_requests = 6", "num_requests = 400").replace('"a", "b"', "")
    (tmp_path / "p.toml").write_text(slow.replace("tag = []", f'tag = ["{marker}a", "{marker}b"]'))
    serve = f"{sys.executable} -m loadgen.mock_server --port {{port}} --tag {{tag}} --itl 0.05"
    cmd = [sys.executable, "-m", "bench_cli", "sweep", "--profile", str(tmp_path / "p.toml")]
    cmd += ["--serve-cmd", serve, "--ray-address", "local", "--no-dashboard"]
    cmd += ["--out", str(tmp_path / "s")]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    def servers() -> list[psutil.Process]:
        found = []
        for p in psutil.process_iter(["cmdline"]):
            if any(marker in part for part in p.info["cmdline"] or []):
                found.append(p)
        return found

    try:
        deadline = time.monotonic() + 120
        while len(servers()) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert len(servers()) == 2, "both points' servers running at once"
        time.sleep(2)  # into the load
        proc.send_signal(signal.SIGINT)
        printed, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, printed
    assert "interrupted by SIGINT" in printed
    assert not [p for p in servers() if p.status() != psutil.STATUS_ZOMBIE]
