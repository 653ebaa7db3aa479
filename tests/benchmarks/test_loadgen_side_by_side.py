"""benchmarks/loadgen_side_by_side.py without the other tools: each tool's own output file read
(captured runs of them in tests/data/loadgen_side_by_side/), what counts as a kept rate, and
one short real round of our tool alone against each instant server."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import loadgen_peers as peers  # noqa: E402
import loadgen_side_by_side as bench  # noqa: E402
from cpu_share import CpuShare  # noqa: E402

from bench_cli.local_server import free_port  # noqa: E402

DATA = ROOT / "tests" / "data" / "loadgen_side_by_side"


def _read(name: str) -> dict:
    return json.loads((DATA / name).read_text())


def test_ours_is_read_from_bench_runs_summary() -> None:
    summary = _read("ours_summary.json")
    n = summary["completed"]
    t = peers.parse_ours(summary, peers.Trial("ours", 300, n))
    check = summary["arrival_check"]
    assert (t.scheduled_rate, t.achieved_rate) == (check["scheduled_rate"], check["achieved_rate"])
    assert t.ttft_p99_ms == pytest.approx(summary["ttft_s"]["p99"] * 1e3)
    assert t.lag_p99_ms == pytest.approx(summary["schedule_lag_s"]["p99"] * 1e3)
    assert (t.completed, t.failed, t.error) == (n, 0, None)


def test_vllm_is_read_from_its_saved_result() -> None:
    result = _read("vllm_result.json")
    n = result["num_prompts"]
    t = peers.parse_vllm(result, peers.Trial("vllm", result["request_rate"], n))
    assert t.scheduled_rate == result["request_rate"]  # its schedule spans N / rate exactly
    assert t.achieved_rate == result["request_throughput"]
    assert t.ttft_p99_ms == result["p99_ttft_ms"]
    assert (t.completed, t.failed, t.error) == (n, 0, None)


def test_inference_perf_is_read_from_its_stage_report() -> None:
    stage = _read("inference_perf_stage_0_lifecycle_metrics.json")
    load = stage["load_summary"]
    t = peers.parse_inference_perf(stage, peers.Trial("inference-perf", 300, load["count"]))
    assert (t.scheduled_rate, t.achieved_rate) == (load["requested_rate"], load["achieved_rate"])
    ttft = stage["successes"]["latency"]["time_to_first_token"]["p99"]
    assert t.ttft_p99_ms == pytest.approx(ttft * 1e3)
    assert t.lag_p99_ms == pytest.approx(load["schedule_delay"]["p99"] * 1e3)
    assert (t.completed, t.failed, t.error) == (load["count"], 0, None)


def test_requests_a_tool_never_completed_count_as_failed() -> None:
    result = _read("vllm_result.json") | {"completed": 10, "failed": 0}
    t = peers.parse_vllm(result, peers.Trial("vllm", 300, 12))
    assert t.failed == 2 and not t.kept


@pytest.mark.parametrize(
    ("achieved", "failed", "kept"),
    [
        (1000.0, 0, True),
        (990.5, 0, True),
        (989.0, 0, False),
        (1011.0, 0, False),
        (1000.0, 1, False),
    ],
)
def test_a_rate_is_kept_within_1pct_of_the_schedules_with_nothing_failed(
    achieved: float, failed: int, kept: bool
) -> None:
    t = peers.Trial("x", 1000, 5000, scheduled_rate=1000.0, achieved_rate=achieved, failed=failed)
    assert t.kept is kept


def test_a_tool_that_writes_no_output_is_an_error_not_a_figure(tmp_path: Path) -> None:
    argv = [sys.executable, "-c", "print('no model named mock'); raise SystemExit(2)"]
    command = (argv, tmp_path / "result.json", peers.parse_vllm, {})
    t = peers.run_tool("vllm", command, peers.Trial("vllm", 300, 10), None, 60, tmp_path / "log")
    assert t.error is not None and "exit 2" in t.error and "no model named mock" in t.error
    assert t.achieved_rate is None and not t.kept


def test_the_servers_busiest_second_on_and_waiting_for_a_cpu() -> None:
    share = CpuShare(pid=0)
    # a sample every 0.25 s: idle, then one second at 60% of a core and 35% waiting for one
    cpu = [0.0] * 4 + [0.15 * k for k in range(1, 5)] + [0.6] * 4
    wait = [0.0] * 4 + [0.0875 * k for k in range(1, 5)] + [0.35] * 4
    share.samples = [(0.25 * i, c, w) for i, (c, w) in enumerate(zip(cpu, wait, strict=True))]
    assert share.peaks() == pytest.approx((0.6, 0.95))


def test_a_server_busy_or_starved_marks_the_trial_server_bound() -> None:
    busy = peers.Trial("ours", 1000, 10, server_cpu_peak=0.95, server_demand_peak=0.95)
    starved = peers.Trial("ours", 1000, 10, server_cpu_peak=0.5, server_demand_peak=0.95)
    idle = peers.Trial("ours", 1000, 10, server_cpu_peak=0.5, server_demand_peak=0.55)
    assert bench.server_bound(busy) and bench.server_bound(starved)
    assert not bench.server_bound(idle)
    assert "server-bound" in bench.row(starved) and "server-bound" not in bench.row(idle)
    assert "AT OR ABOVE" in bench.server_verdict([idle, starved], "instant")
    assert "not the limit" in bench.server_verdict([idle], "instant")


@pytest.mark.parametrize("server", ["instant", "mock"])
def test_one_short_round_of_ours_alone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], server: str
) -> None:
    out = tmp_path / "out.json"
    argv = ["--rates", "100", "--rounds", "1", "--seconds", "2", "--no-search", "--server", server]
    argv += ["--port", str(free_port()), "--json", str(out)]
    everything = bench.main(argv)
    printed = capsys.readouterr().out
    assert "vllm: skipped" in printed and "inference-perf: skipped" in printed
    assert json.loads(out.read_text()) == json.loads(json.dumps(everything))
    (trial,) = everything["trials"]
    assert trial["tool"] == "ours" and trial["error"] is None, trial
    assert (trial["requests"], trial["completed"], trial["failed"]) == (200, 200, 0)
    assert trial["server_requests"] >= 200  # the server saw every request the tool counted
    assert trial["achieved_rate"] > 0 and trial["ttft_p99_ms"] > 0
    assert trial["source"].endswith("summary.json")
    assert 0 <= trial["server_cpu_peak"] <= trial["server_demand_peak"]
    (median,) = everything["medians"]
    assert median["tool"] == "ours" and median["rounds"] == 1
