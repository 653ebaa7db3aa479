"""`bench run` end to end: against the bundled engine (a tiny random model behind SmolLM2's
tokenizer) in-process and through HTTP, its results folder, Ctrl-C mid-run, and bad input."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from rich.console import Console

from bench_cli.run.execute import execute

# What a test of a run through the bundled server adds when it checks no compiled path: the
# server's start then skips torch.compile (tens of seconds on a busy 2-core machine, at every
# start). test_run_against_the_bundled_engine keeps the default, compiled, path.
EAGER = {"enforce_eager": True}

SMALL = {
    "model": "tiny-smollm2",
    "rate": 20.0,
    "num_requests": 12,
    "warmup": 2,
    "input_len": "uniform:8:48",
    "output_len": "6",
    "slo": "ttft=5,tpot=1",
    # These tests check what a run does, on machines as busy as CI's: a lag that makes a run
    # INVALID (exit 3) is tested in test_run_lifecycle.py with limits of its own.
    "max_p99_lag_ms": 1000.0,
}


def bench_run(tmp_path: Path, profile: str = "default", **flags: Any) -> tuple[int, str, Path]:
    out = tmp_path / "run"
    buf = io.StringIO()
    console = Console(file=buf, width=120)
    flags = {**SMALL, "out": str(out), **flags}
    rc = execute(profile, flags, dashboard=False, console=console)
    return rc, buf.getvalue(), out


@pytest.mark.parametrize(
    ("target", "flags"),
    [
        ("in-process", {"in_process": True}),
        ("HTTP", {}),
        ("HTTP chat, closed loop", {"endpoint": "chat", "rate": None, "concurrency": 4}),
    ],
)
def test_run_against_the_bundled_engine(tmp_path: Path, target: str, flags: dict) -> None:
    rc, printed, out = bench_run(tmp_path, max_num_seqs=8, **flags)
    assert rc == 0, printed
    assert "Successful requests" in printed and "TTFT" in printed
    lines = (out / "requests.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    measured = [r for r in records if not r["warmup"]]
    assert len(records) == 14 and len(measured) == 12
    assert all(r["status"] == "ok" and r["output_tokens"] == 6 for r in records)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["completed"] == 12 and summary["failed"] == 0
    assert summary["total_output_tokens"] == 72
    for key in ("ttft_s", "itl_s", "tpot_s", "e2e_s", "schedule_lag_s"):
        assert set(summary[key]) >= {"mean", "p50", "p90", "p95", "p99", "max"}
    assert summary["config"]["run"]["model"] == "tiny-smollm2"
    assert summary["config"]["engine"]["scheduler"]["max_num_seqs"] == 8
    assert summary["config"]["engine"]["decode_attention"] == "compiled"
    assert summary["config"]["engine"]["model_forward"] == "compiled"
    assert summary["config"]["engine"]["linears"] == "kernel"
    config = json.loads((out / "config.json").read_text())
    assert config["versions"]["torch"] and "cpu_count" in config["hardware"]
    assert len(pd.read_csv(out / "summary.csv")) == 1
    steps = [json.loads(line) for line in (out / "steps.jsonl").read_text().splitlines()]
    probe = summary["test_request"]  # sent before the load; the engine computed it too
    assert probe["status"] == "ok" and probe["output_tokens"] == 4
    # The first token of each request is prefill's.
    assert sum(s["decode_tokens"] for s in steps) == 14 * 5 + probe["output_tokens"] - 1
    prompts = sum(r["prompt_tokens"] for r in records) + probe["prompt_tokens"]
    # Prompt tokens are computed, or served by the prefix cache: chat prompts share the
    # template's system prompt (one 16-token block), random completion prompts share nothing.
    cached = sum(s["cached_tokens"] for s in steps)
    assert sum(s["prefill_tokens"] for s in steps) == prompts - cached
    assert (cached > 0) == ("chat" in target)
    measured_steps = [s for s in steps if s["t"] >= summary["clock_t0"]]
    assert 0 < len(measured_steps) < len(steps)  # warm-up steps came before t0
    page = (out / "report.html").read_text()
    for title in ("Latency distributions", "Requests over time", "Throughput and telemetry"):
        assert title in page
    assert ("Engine steps" in page) == (target != "external")
    timeline = pd.read_csv(out / "timeline.csv")
    assert len(timeline) >= 2 and summary["telemetry"]["samples"] == len(timeline)
    assert summary["telemetry"]["peak_server_rss_mb"] > 10  # no GPU here: the server process
    if target == "in-process":
        assert all(r["prompt_tokens"] == r["input_len"] for r in records)
    else:  # the server's usage counts the prompt; chat adds its template's tokens
        assert all(r["prompt_tokens_source"] == "usage" for r in records)
        grew = [r["prompt_tokens"] > r["input_len"] for r in records]
        assert all(grew) if "chat" in target else not any(grew)
        assert (out / "server.log").exists()
        assert summary["telemetry"]["peak_engine_kv_peak_blocks_used"] > 0  # from /metrics
    if "closed" in target:
        assert "arrival_check" not in summary
    else:
        assert summary["arrival_check"]["process"] == "poisson"


def test_ctrl_c_keeps_every_finished_record(
    tmp_path: Path, mock_server: Callable[..., str]
) -> None:
    url = mock_server("--ttft", "0.05", "--itl", "0.01")
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "bench_cli", "run", "--base-url", url, "--model", "mock"]
    cmd += ["--rate", "40", "--num-requests", "5000", "--output-len", "8", "--input-len", "16"]
    cmd += ["--no-dashboard", "--out", str(out)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    jsonl = out / "requests.jsonl"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if jsonl.exists() and len(jsonl.read_text().splitlines()) >= 22:  # 2 warm-up
            break
        time.sleep(0.1)
    os.kill(proc.pid, signal.SIGINT)
    printed, _ = proc.communicate(timeout=60)
    assert proc.returncode == 130, printed
    records = [json.loads(line) for line in jsonl.read_text().splitlines()]
    ok = [r for r in records if r["status"] == "ok" and not r["warmup"]]
    assert len(ok) >= 20 and len(records) < 5000
    assert {r["status"] for r in records} <= {"ok", "cancelled"}
    summary = json.loads((out / "summary.json").read_text())
    assert summary["interrupted"] and summary["completed"] == len(ok)
    assert "interrupted" in printed


def test_an_external_server_without_model_uses_its_first_listed_model(
    tmp_path: Path, mock_server: Callable[..., str]
) -> None:
    url = mock_server("--ttft", "0.01", "--itl", "0.001")
    rc, printed, out = bench_run(tmp_path, base_url=url, model=None, warmup=0)
    assert rc == 0, printed
    summary = json.loads((out / "summary.json").read_text())
    assert summary["config"]["run"]["model"] == "mock" and summary["completed"] == 12
    assert summary["config"]["target"] == {"kind": "external", "base_url": url}


def test_a_broken_trace_names_the_line(tmp_path: Path) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"timestamp": 0, "input_len": 5, "output_len": 3}\n{"timestamp": 1}\n')
    rc, printed, _ = bench_run(
        tmp_path, trace=str(trace), trace_format="jsonl", rate=None, input_len=None
    )
    assert rc == 2
    assert "t.jsonl" in printed and "line 2" in printed


@pytest.mark.parametrize(
    ("flags", "error"),
    [
        ({"arrival": "gamma", "rate": None, "profile": "bare"}, "need --rate"),
        ({"input_len": "uniform:9:2"}, "lo 9 > hi 2"),
        ({"model": "no-such-model", "tokenizer": "no-such-model"}, "no-such-model"),
        ({"dataset": "csv:x", "input_len": None}, "sharegpt:PATH"),
        ({"slo": "ttft=500ms"}, "not a number"),  # before the run, not after it
        ({"dataset": "sharegpt:nowhere.json", "input_len": None, "concurrency": 2}, "nowhere.json"),
        ({"base_url": "http://127.0.0.1:9/v1", "model": "m", "max_num_seqs": 4}, "bundled"),
        ({"in_process": True, "max_num_seqs": 0}, "max_num_seqs"),
    ],
)
def test_bad_settings_are_clear_errors(tmp_path: Path, flags: dict, error: str) -> None:
    if flags.get("profile") == "bare":  # a profile that gives no rate
        (tmp_path / "bare.toml").write_text('name = "bare"\n')
        flags = {**flags, "profile": str(tmp_path / "bare.toml")}
    rc, printed, out = bench_run(tmp_path, **flags)
    assert rc == 2 and error in printed
    assert not (out / "requests.jsonl").exists()  # nothing half-written


def test_a_results_folder_is_never_reused(tmp_path: Path) -> None:
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "requests.jsonl").write_text("{}\n")
    rc, printed, _ = bench_run(tmp_path)
    assert rc == 2 and "already holds files" in printed


def test_a_failing_test_request_stops_the_run_before_any_load(tmp_path: Path) -> None:
    flags = {"base_url": "http://127.0.0.1:9/v1", "model": "m", "tokenizer": "smollm2-135m"}
    rc, printed, out = bench_run(tmp_path, **flags)
    assert rc == 1, printed
    assert "test request to http://127.0.0.1:9/v1/completions failed" in printed
    assert "nothing was measured" in " ".join(printed.split())
    assert not (out / "requests.jsonl").exists() or not (out / "requests.jsonl").read_text()


def test_a_run_where_nothing_succeeded_exits_1() -> None:
    from bench_cli.run.execute import exit_code

    assert exit_code({"interrupted": False, "completed": 0}) == 1
    assert exit_code({"interrupted": False, "completed": 3}) == 0
    assert exit_code({"interrupted": True, "completed": 0, "stop_signal": 15}) == 143


def test_base_url_with_or_without_v1(tmp_path: Path, mock_server: Callable[..., str]) -> None:
    url = mock_server("--ttft", "0.001", "--itl", "0.001")  # .../v1
    root = url.removesuffix("/v1")
    for given in (url, root, root + "/"):
        out = tmp_path / given.replace("/", "_").replace(":", "_")
        flags = {"base_url": given, "model": "mock", "warmup": 0, "num_requests": 3}
        rc, printed, run = bench_run(out, **flags)
        assert rc == 0, printed
        summary = json.loads((run / "summary.json").read_text())
        assert summary["completed"] == 3
        assert summary["config"]["target"]["base_url"] == url


def test_results_are_strict_json_even_for_an_infinite_rate(
    tmp_path: Path, mock_server: Callable[..., str]
) -> None:
    from bench_cli.export import write_json

    def strict(text: str) -> Any:
        return json.loads(text, parse_constant=lambda c: pytest.fail(f"not JSON: {c}"))

    url = mock_server("--ttft", "0.001", "--itl", "0.001")
    flags = {"base_url": url, "model": "mock", "warmup": 0, "num_requests": 4}
    rc, printed, run = bench_run(tmp_path, rate=float("inf"), **flags)
    assert rc == 0, printed
    assert strict((run / "summary.json").read_text())["config"]["run"]["rate"] == "inf"
    strict((run / "config.json").read_text())

    write_json(tmp_path / "x.json", {"rate": float("inf"), "p": [float("nan"), 1.5], "n": -1e999})
    assert strict((tmp_path / "x.json").read_text()) == {
        "rate": "inf",
        "p": [None, 1.5],
        "n": "-inf",
    }


def test_a_sharegpt_run_says_how_much_of_the_file_it_used(
    tmp_path: Path, mock_server: Callable[..., str]
) -> None:
    """Issue 17, defect 11: the drop and reuse counts are printed and kept in config.json."""
    url = mock_server("--ttft", "0.001", "--itl", "0.001")
    dataset = Path(__file__).parents[1] / "data" / "sharegpt_sample.json"
    flags = {"base_url": url, "model": "mock", "warmup": 0, "num_requests": 20}
    rc, printed, run = bench_run(
        tmp_path, dataset=f"sharegpt:{dataset}", input_len=None, output_len=None, **flags
    )
    assert rc == 0, printed
    config = json.loads((run / "config.json").read_text())
    used, total = config["dataset"]["used"], config["dataset"]["conversations"]
    assert 0 < used < total
    flat = " ".join(printed.split())
    assert f"{used} of {total} conversations used" in flat
    assert f"20 requests reuse each about {20 / used:.1f} times" in flat


def test_sampling_flags_reach_the_in_process_engine(tmp_path: Path) -> None:
    rc, printed, run = bench_run(
        tmp_path, in_process=True, temperature=1.0, top_p=0.9, top_k=5, num_requests=4
    )
    assert rc == 0, printed
    summary = json.loads((run / "summary.json").read_text())
    assert summary["completed"] == 4
    run_cfg = summary["config"]["run"]
    assert (run_cfg["temperature"], run_cfg["top_p"], run_cfg["top_k"]) == (1.0, 0.9, 5)


def test_a_ramp_up_run_against_a_server(tmp_path: Path, mock_server: Callable[..., str]) -> None:
    url = mock_server("--ttft", "0.001", "--itl", "0.001")
    ramp = {"ramp_up_strategy": "exponential", "ramp_up_start_rps": 5.0, "ramp_up_end_rps": 80.0}
    flags = {"base_url": url, "model": "mock", "warmup": 0, "num_requests": 30, "rate": None}
    rc, printed, run = bench_run(tmp_path, arrival="constant", **ramp, **flags)
    assert rc == 0, printed
    assert "constant exponential ramp 5->80 req/s" in " ".join(printed.split())
    summary = json.loads((run / "summary.json").read_text())
    check = summary["arrival_check"]
    assert check["ramp"] == {"strategy": "exponential", "start_rps": 5.0, "end_rps": 80.0}
    assert "target_rate" not in check
    records = [json.loads(line) for line in (run / "requests.jsonl").read_text().splitlines()]
    gaps = np.diff(sorted(r["scheduled_s"] for r in records))
    assert np.allclose(gaps, 1 / (5 * 16 ** (np.arange(1, 30) / 29)))


def test_a_shared_prefix_run_reports_the_servers_cached_tokens(tmp_path: Path) -> None:
    """bench serve's usage says how many prompt tokens its prefix cache served; the summary
    adds them up and prints their share, and the telemetry gives the run's hit rate."""
    rc, printed, run = bench_run(
        tmp_path, max_num_seqs=8, shared_prefix_len=48, num_prefix_groups=1, warmup=0, **EAGER
    )
    assert rc == 0, printed
    summary = json.loads((run / "summary.json").read_text())
    records = [json.loads(line) for line in (run / "requests.jsonl").read_text().splitlines()]
    assert summary["total_cached_tokens"] == sum(r["cached_tokens"] for r in records) > 0
    assert all(r["cached_tokens"] % 16 == 0 for r in records)
    assert "of which from the prefix cache" in printed
    assert summary["telemetry"]["prefix_cache_hit_rate"] > 0


@pytest.mark.parametrize("target", ["in-process", "HTTP"])
def test_n_asks_every_prompt_for_n_completions(tmp_path: Path, target: str) -> None:
    """--n: parallel sampling through each door; each record counts its n completions."""
    flags = {"in_process": True} if target == "in-process" else EAGER
    rc, printed, run = bench_run(tmp_path, n=3, num_requests=3, warmup=0, **flags)
    assert rc == 0, printed
    summary = json.loads((run / "summary.json").read_text())
    records = [json.loads(line) for line in (run / "requests.jsonl").read_text().splitlines()]
    assert summary["completed"] == 3 and summary["total_output_tokens"] == 3 * 3 * 6
    assert all(r["n"] == 3 and r["output_tokens"] == 18 for r in records)
    assert summary["config"]["run"]["n"] == 3


@pytest.mark.parametrize("target", ["in-process", "HTTP"])
def test_speculative_decoding_shows_its_acceptance_in_the_summary(
    tmp_path: Path, target: str
) -> None:
    """--speculative-config reaches the engine through each door; the summary gives the
    run's acceptance (from the server's /metrics, or the in-process engine's counters) and
    says that multi-token chunks came from speculation."""
    flags = {"in_process": True} if target == "in-process" else EAGER
    spec = '{"method": "draft_layers", "num_speculative_tokens": 3, "num_draft_layers": 1}'
    rc, printed, run = bench_run(
        tmp_path, output_len="24", warmup=0, speculative_config=spec, **flags
    )
    assert rc == 0, printed
    summary = json.loads((run / "summary.json").read_text())
    t = summary["telemetry"]
    assert t["spec_drafts"] > 0 and 0 < t["spec_accepted_tokens"] <= t["spec_draft_tokens"]
    assert t["spec_acceptance_rate"] == t["spec_accepted_tokens"] / t["spec_draft_tokens"]
    per_pos = t["spec_acceptance_per_pos"]  # what --sim-acceptance takes
    assert len(per_pos) == 3 and per_pos == sorted(per_pos, reverse=True)
    assert sum(per_pos) * t["spec_drafts"] == pytest.approx(t["spec_accepted_tokens"])
    assert "accepted by draft position" in printed
    assert t["spec_draft_share"] == 1.0  # a draft model always proposes
    assert "spec_draft_share_by_request" not in t  # so no request misses a draft
    assert summary["total_output_tokens"] == 12 * 24  # speculation changes no count
    assert "Spec decode acceptance rate" in printed
    assert summary["config"]["engine"]["speculative_config"]["num_speculative_tokens"] == 3
    warning = next(w for w in summary["warnings"] if w.startswith("some chunks carried"))
    assert "speculative decoding" in warning


def test_tensor_parallel_serving_reports_its_config_and_stops_its_workers(tmp_path: Path) -> None:
    """--tensor-parallel-size 2 through bench run: a server with a worker process, the
    run's config and /metrics say so, and the workers end with the server."""
    rc, printed, run = bench_run(
        tmp_path, tensor_parallel_size=2, num_requests=6, warmup=0, **EAGER
    )
    assert rc == 0, printed
    summary = json.loads((run / "summary.json").read_text())
    assert summary["completed"] == 6 and summary["total_output_tokens"] == 36
    assert summary["config"]["engine"]["tensor_parallel_size"] == 2
    log = (run / "server.log").read_text()
    assert "tensor parallel 2" in log
    workers = subprocess.run(
        ["pgrep", "-f", "engine.distributed.worker"], capture_output=True, text=True
    ).stdout.split()
    assert not workers  # stopped with the server
