"""`make demo` (`bench run --explain`) ends by saying what its numbers mean in two lines and
which report.html to open (issue 45)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from typer.testing import CliRunner

from bench_cli.app import app
from bench_cli.run.explain import explain


def test_explain_says_what_the_headline_numbers_mean() -> None:
    summary = {
        "ttft_s": {"p50": 0.0123, "p99": 0.0456},
        "itl_s": {"p50": 0.002, "p99": 0.011},
        "request_throughput": 16.64,
        "output_throughput": 2110.5,
        "completed": 30,
    }
    lines = explain(summary, "poisson 20 req/s")
    assert len(lines) == 2
    assert "TTFT" in lines[0] and "12.3 ms" in lines[0] and "first token" in lines[0]
    assert "ITL" in lines[0] and "2.00 ms" in lines[0]
    assert "16.64 req/s" in lines[1] and "2,110 output tok/s" in lines[1]
    assert "poisson 20 req/s" in lines[1]
    assert explain({"completed": 0}, "x") == []  # nothing measured: nothing to explain


def test_bench_run_explain_ends_with_the_lines_and_the_report(
    tmp_path: Path, mock_server: Callable[..., str]
) -> None:
    url = mock_server("--ttft", "0.001", "--itl", "0.001")
    args = ["run", "--base-url", url, "--num-requests", "3", "--output-len", "4"]
    args += ["--input-len", "8", "--no-dashboard", "--out", str(tmp_path / "r"), "--explain"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    tail = result.output.rstrip("\n").splitlines()[-3:]
    assert "TTFT" in tail[0] and "req/s" in tail[1], result.output
    assert f"open {tmp_path / 'r'}/report.html" in tail[2], result.output
    assert Path(tmp_path / "r" / "report.html").is_file()
