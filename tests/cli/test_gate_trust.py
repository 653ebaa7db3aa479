"""`bench gate` on runs a user cannot trust: nothing succeeded, flagged INVALID, or a limit
written without its unit (issue 41 items 9, 19, 20)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench_cli.gate.checks import Limit
from bench_cli.gate.results import GateInputError
from tests.cli.sweep.test_sweep_gate import gate, write_run, write_sweep

LIMIT = ["--max-regression", "output_throughput=10%"]


def test_a_run_where_nothing_succeeded_fails_the_gate(tmp_path: Path) -> None:
    base = write_run(tmp_path / "base")
    empty = {"completed": 0, "output_throughput": 0.0, "failed": 12}
    dead = write_run(tmp_path / "dead", **empty)
    summary = dead / "summary.json"
    summary.write_text(summary.read_text().replace('"p99": 0.1', '"p99": null'))
    rc, out = gate(str(dead), "--baseline", str(base), *LIMIT, "--max-regression", "ttft_s.p99=5%")
    assert rc == 1, out
    assert "no request succeeded" in out and "has no metric" not in out
    rc, out = gate(str(base), "--baseline", str(dead), "--max-regression", "ttft_s.p99=5%")
    assert rc == 1 and "no request succeeded" in out and "baseline" in out


@pytest.mark.parametrize(
    ("text", "fraction"), [("40%", 0.40), ("0.4", 0.40), ("5 %", 0.05), ("1", 1.0), ("0", 0.0)]
)
def test_limits_take_a_percentage_or_a_fraction(text: str, fraction: float) -> None:
    assert Limit.parse(f"output_throughput={text}").max_regression == pytest.approx(fraction)


def test_a_bare_limit_above_1_is_refused_as_ambiguous(tmp_path: Path) -> None:
    with pytest.raises(GateInputError, match=r"40%.*0\.4"):
        Limit.parse("output_throughput=40")
    base = write_run(tmp_path / "base", output_throughput=100.0)
    worse = write_run(tmp_path / "worse", output_throughput=50.0)
    rc, out = gate(str(worse), "--baseline", str(base), "--max-regression", "output_throughput=40")
    assert rc == 2 and "ambiguous" in out


def test_the_gate_table_shows_the_limit_it_applied_as_a_percentage(tmp_path: Path) -> None:
    base = write_run(tmp_path / "base", output_throughput=100.0)
    worse = write_run(tmp_path / "worse", output_throughput=50.0)
    rc, out = gate(str(worse), "--baseline", str(base), "--max-regression", "output_throughput=0.4")
    assert rc == 1 and "40% worse" in out


def test_an_invalid_run_fails_the_gate_unless_allowed(tmp_path: Path) -> None:
    base = write_run(tmp_path / "base")
    bad = write_run(tmp_path / "bad", valid=False)
    rc, out = gate(str(bad), "--baseline", str(base), *LIMIT)
    assert rc == 1 and "INVALID" in out and "--allow-invalid" in out
    rc, out = gate(str(base), "--baseline", str(bad), *LIMIT)
    assert rc == 1 and "INVALID" in out
    rc, out = gate(str(bad), "--baseline", str(base), *LIMIT, "--allow-invalid")
    assert rc == 0, out
    assert "INVALID" in out  # still said, not silently compared


def test_an_invalid_sweep_point_fails_the_gate(tmp_path: Path) -> None:
    def row(rate: int, valid: float) -> dict:
        return {"rate": rate, "output_throughput": 10.0, "valid": valid, "runs": 1}

    base = write_sweep(tmp_path / "base", [row(1, 1.0), row(2, 1.0)], axes=("rate",))
    cur = write_sweep(tmp_path / "cur", [row(1, 1.0), row(2, 0.5)], axes=("rate",))
    rc, out = gate(str(cur), "--baseline", str(base), *LIMIT)
    assert rc == 1 and "rate=2" in out and "INVALID" in out
    rc, out = gate(str(cur), "--baseline", str(base), *LIMIT, "--allow-invalid")
    assert rc == 0, out


def test_a_ratio_over_an_invalid_point_fails_unless_allowed(tmp_path: Path) -> None:
    def row(batching: str, tput: float, valid: float) -> dict:
        return {"batching": batching, "rate": 1, "output_throughput": tput, "valid": valid}

    rows = [row("continuous", 30.0, 0.0), row("static", 10.0, 1.0)]
    cur = write_sweep(tmp_path / "cur", rows)
    ratio = "output_throughput[batching=continuous]/output_throughput[batching=static]>=2"
    rc, out = gate(str(cur), "--ratio", ratio)
    assert rc == 1 and "INVALID" in out and "batching=continuous" in out
    rc, out = gate(str(cur), "--ratio", ratio, "--allow-invalid")
    assert rc == 0, out
