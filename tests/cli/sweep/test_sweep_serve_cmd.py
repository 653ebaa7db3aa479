"""`bench sweep --serve-cmd`: any server restarted per point, its settings filled from the grid
(issue 44): `bench serve` itself through a command, the refusals before anything starts, and
no child left after an interrupt in any phase."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pandas as pd
import psutil
import pytest
from rich.console import Console

from bench_cli.sweep.options import SweepOptions
from bench_cli.sweep.runner import run_sweep
from bench_cli.sweep.serve_cmd import ServeCommand

SERVE = f"{sys.executable} -m bench_cli serve --model tiny-smollm2 --port {{port}}"
PROFILE = """
name = "cmd"
model = "tiny-smollm2"
num_requests = 4
warmup = 0
input_len = "16"
output_len = "4"
concurrency = 2  # a closed loop: no schedule to fall behind on a loaded machine

[sweep]
max_num_seqs = [1, 2]
"""


def sweep(tmp: Path, profile: str, serve: ServeCommand | None, **kw: Any) -> tuple[int, str]:
    path = tmp / "profile.toml"
    path.write_text(profile)
    buf = io.StringIO()
    base_url = serve.base_url if serve is not None else None
    flags = {"base_url": base_url, "model": None, "api_key": None, "name": None}
    flags["out"] = str(tmp / "sweep")
    options = SweepOptions(resume=kw.pop("resume", None), serve=serve)
    rc = run_sweep(str(path), flags, options, Console(file=buf, width=160))
    return rc, buf.getvalue()


def test_a_serve_cmd_sweep_of_bench_serve_runs_each_point_on_its_own_server(
    tmp_path: Path,
) -> None:
    after = f"echo reset >> {tmp_path / 'resets'}"
    template = SERVE + " --enforce-eager --max-num-seqs {max_num_seqs}"  # no compile: quicker
    serve = ServeCommand(template, None, None, 120, after)
    rc, printed = sweep(tmp_path, PROFILE, serve)
    assert rc == 0, printed
    table = pd.read_csv(tmp_path / "sweep" / "sweep.csv")
    assert list(table["max_num_seqs"]) == [1, 2]
    assert list(table["completed"]) == [4, 4] and list(table["failed"]) == [0, 0]
    for point, seqs in zip(sorted((tmp_path / "sweep").glob("p*")), (1, 2), strict=True):
        ran = json.loads((point / "server.json").read_text())
        assert ran["settings"] == {"max_num_seqs": seqs}
        assert ran["cmd"][ran["cmd"].index("--max-num-seqs") + 1] == str(seqs)
        assert (point / "server.log").stat().st_size > 0  # the server's own output
        config = json.loads((point / "config.json").read_text())
        assert config["server"]["kind"] == "servebench"
    assert (tmp_path / "resets").read_text() == "reset\nreset\n"  # after each point
    # resume: every point done, no server started again
    rc, printed = sweep(tmp_path, PROFILE, serve, resume=str(tmp_path / "sweep"))
    assert rc == 0 and printed.count("done before, kept") == 2, printed


@pytest.mark.parametrize(
    ("template", "axes", "message"),
    [
        ("mock --port {port}", "tag = ['a']", "tag reach neither"),
        ("mock --port {port} --tag {tag} --x {other}", "tag = ['a']", "{other}"),
        ("mock --tag {tag}", "tag = ['a']", "needs --base-url"),
        ("mock --port {port} --tag '{tag}", "tag = ['a']", "quotation"),
    ],
)
def test_a_grid_key_or_placeholder_the_other_lacks_is_refused_before_anything_starts(
    tmp_path: Path, template: str, axes: str, message: str
) -> None:
    profile = f'num_requests = 2\nmodel = "m"\n[sweep]\n{axes}\nrate = [1, 2]\n'
    rc, printed = sweep(tmp_path, profile, ServeCommand(template))
    assert rc == 2 and message in printed, printed
    assert not list((tmp_path / "sweep").glob("p*"))


MOCK = f"{sys.executable} -m loadgen.mock_server --port {{port}} --tag {{tag}} --itl 0.05"
SLOW_PROFILE = """
name = "mock"
model = "mock"
num_requests = 200
warmup = 0
input_len = "8"
output_len = "20"
rate = 5

[sweep]
tag = ["a", "b"]
"""


def _descendants(proc: psutil.Process) -> list[psutil.Process]:
    try:
        return proc.children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def _wait_for(check: Any, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.1)
    raise AssertionError("timed out waiting for the phase")


@pytest.mark.parametrize("phase", ["starting", "running", "stopping"])
def test_no_child_outlives_an_interrupt_in_any_phase(tmp_path: Path, phase: str) -> None:
    (tmp_path / "p.toml").write_text(SLOW_PROFILE)
    # the server a grandchild, as vLLM's workers are: only its process group reaches it
    template, extra = f"sh -c '{MOCK} & wait'", []
    if phase == "starting":  # never ready: the sweep waits on it
        extra = ["--ready-url", "http://127.0.0.1:{port}/never", "--ready-timeout", "300"]
    if phase == "stopping":  # a group that ignores SIGINT: the stop waits for it to end
        template = f"sh -c 'trap \"\" INT; {MOCK} & sleep 300'"
        (tmp_path / "p.toml").write_text(SLOW_PROFILE.replace("= 200", "= 2"))
    cmd = [sys.executable, "-m", "bench_cli", "sweep", "--profile", str(tmp_path / "p.toml")]
    cmd += ["--serve-cmd", template, *extra, "--no-dashboard", "--out", str(tmp_path / "s")]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    parent = psutil.Process(proc.pid)
    try:
        point = tmp_path / "s" / "p00-tag-a"
        if phase == "starting":
            _wait_for(lambda: (point / "server.log").exists() and _descendants(parent))
            time.sleep(1)
        elif phase == "running":
            _wait_for(lambda: (point / "config.json").exists())
            time.sleep(1)
        else:
            _wait_for(lambda: (point / "summary.json").exists())
            time.sleep(2)
        children = _descendants(parent)
        assert children, "no server child"
        os.kill(proc.pid, signal.SIGINT)
        printed, _ = proc.communicate(timeout=60)
        assert proc.returncode == 130, printed
        _, alive = psutil.wait_procs(children, timeout=10)
        assert not alive, f"{alive} outlived the sweep ({phase}):\n{printed}"
        assert not (tmp_path / "s" / "p01-tag-b").exists()
    finally:
        proc.kill()
        proc.wait()


GRID = """
name = "grid"
model = "tiny-smollm2"
num_requests = 4
warmup = 0
input_len = "24"
output_len = "4"
concurrency = 4

[sweep]
max_num_seqs = [1, 4]
max_num_batched_tokens = [16, 64]  # 16: each 24-token prompt in two chunks
"""
# what a request's record holds that no timing changes
SAME = ("index", "input_len", "output_len", "prompt_tokens", "cached_tokens", "output_tokens")
SAME += ("status", "finish_reason")


def _steps(path: Path) -> list[tuple[int, int, int]]:
    """(prefill tokens, decode tokens, sequences) of each engine step the server logged."""
    steps = [json.loads(line) for line in path.read_text().splitlines()]
    return [(s["prefill_tokens"], s["decode_tokens"], s["seqs"]) for s in steps]


def _points(folder: Path) -> list[Path]:
    return sorted(p for p in folder.glob("p*") if p.is_dir())


def test_a_serve_cmd_sweep_of_bench_serve_matches_the_bundled_engine_sweep(
    tmp_path: Path,
) -> None:
    """The done-when of issue 44: the same grid (max_num_seqs x chunk size) and load, once
    with the bundled engine restarted per point, once with `bench serve` started per point by
    --serve-cmd, give per point the same requests, token counts and engine work (timing
    aside); the step logs show each point's settings reached its server."""
    (tmp_path / "bundled").mkdir()
    rc, printed = sweep(
        tmp_path / "bundled", GRID.replace("[sweep]", "enforce_eager = true\n[sweep]"), None
    )
    assert rc == 0, printed
    steps = tmp_path / "steps-{max_num_seqs}-{max_num_batched_tokens}.jsonl"
    template = SERVE + " --enforce-eager --max-num-seqs {max_num_seqs}"
    template += f" --max-num-batched-tokens {{max_num_batched_tokens}} --step-log {steps}"
    rc, printed = sweep(tmp_path, GRID, ServeCommand(template, None, None, 120))
    assert rc == 0, printed
    bundled = pd.read_csv(tmp_path / "bundled" / "sweep" / "sweep.csv")
    launched = pd.read_csv(tmp_path / "sweep" / "sweep.csv")
    same = ["max_num_seqs", "max_num_batched_tokens", "completed", "failed"]
    same += ["prompt_tokens_computed", "telemetry.preemptions"]
    pd.testing.assert_frame_equal(bundled[same], launched[same])
    assert list(launched["completed"]) == [4] * 4
    points = zip(_points(tmp_path / "bundled" / "sweep"), _points(tmp_path / "sweep"), strict=True)
    for (a, b), row in zip(points, launched.to_dict("records"), strict=True):
        seqs, budget = row["max_num_seqs"], row["max_num_batched_tokens"]
        records = [  # in the order sent (requests.jsonl is in the order they finished)
            sorted([json.loads(line)[k] for k in SAME] for line in (p / "requests.jsonl").open())
            for p in (a, b)
        ]
        assert records[0] == records[1] and len(records[0]) == 4
        ours = _steps(a / "steps.jsonl")
        theirs = _steps(tmp_path / f"steps-{seqs}-{budget}.jsonl")
        # the same work: every prompt token computed once, every output token but the first
        # decoded (5 requests with the probe; a step may count a prompt's last token as decode)
        assert sum(s[0] + s[1] for s in ours) == sum(s[0] + s[1] for s in theirs) == 5 * 27
        for log in (ours, theirs):  # within the point's settings: they reached the server
            assert max(s[0] + s[1] for s in log) <= budget and max(s[2] for s in log) <= seqs
            assert max(s[0] for s in log) == min(budget, 24) or seqs > 1
        if seqs == 1:  # one request at a time: the step sequence itself is fixed
            assert ours == theirs
