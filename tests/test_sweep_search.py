"""`bench sweep --slo-search LO:HI[:STEPS]` (issue 44): the highest rate whose SLO attainment
stays at 90 %, by bisection: checked by counting runs on a made-up attainment curve, and end to
end against the mock server."""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from pathlib import Path

import pandas as pd
import pytest
from rich.console import Console

from bench_cli.sweep import run_sweep
from bench_cli.sweep_search import SearchSpec, bisect


def test_bisection_finds_the_knee_in_steps_plus_two_runs() -> None:
    tested: list[float] = []

    def attainment(rate: float) -> float:  # served up to 13 req/s
        tested.append(rate)
        return 0.95 if rate <= 13 else 0.5

    found = bisect(attainment, SearchSpec(1, 64, 6))
    assert len(tested) == 6 + 2 and tested[:2] == [64, 1]
    assert found.served is not None and found.failed is not None
    assert found.served <= 13 < found.failed and found.failed - found.served <= 63 / 2**6 + 0.01
    assert bisect(lambda r: 0.99, SearchSpec(1, 8)).text() == "not reached up to 8 req/s"
    assert bisect(lambda r: None, SearchSpec(1, 8)).served is None  # nothing completed: a miss


@pytest.mark.parametrize("text", ["4", "0:8", "8:4", "1:inf", "1:8:0", "a:b"])
def test_a_bad_search_spec_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="--slo-search"):
        SearchSpec.parse(text)


PROFILE = """
name = "search"
model = "mock"
num_requests = 3
warmup = 0
input_len = "8"
output_len = "4"
slo = "ttft=0.001"
"""


def test_a_search_that_no_rate_passes_says_none(
    tmp_path: Path, mock_server: Callable[..., str]
) -> None:
    url = mock_server("--ttft", "0.02", "--itl", "0.001")
    (tmp_path / "p.toml").write_text(PROFILE)
    buf = io.StringIO()
    flags = {"base_url": url, "model": None, "api_key": None, "name": None}
    flags["out"] = str(tmp_path / "s")
    console = Console(file=buf, width=160)
    rc = run_sweep(str(tmp_path / "p.toml"), flags, 1, None, False, console, search="2:8")
    printed = buf.getvalue()
    assert rc == 0, printed
    assert "highest rate with 90% in SLO: none" in printed
    table = pd.read_csv(tmp_path / "s" / "sweep.csv")
    assert list(table["rate"]) == [8.0, 2.0] and list(table["slo_attainment"]) == [0.0, 0.0]
    record = json.loads((tmp_path / "s" / "slo_search.json").read_text())
    assert record["settings"]["all"]["served"] is None
    assert (tmp_path / "s" / "report.html").exists()
    again = run_sweep(
        str(tmp_path / "p.toml"), flags, 1, str(tmp_path / "s"), False, console, search="2:8"
    )
    assert again == 0 and buf.getvalue().count("done before, kept") == 2, buf.getvalue()
    no_slo = PROFILE.replace('slo = "ttft=0.001"\n', "")
    (tmp_path / "q.toml").write_text(no_slo)
    flags["out"] = str(tmp_path / "t")
    rc = run_sweep(str(tmp_path / "q.toml"), flags, 1, None, False, console, search="2:8")
    assert rc == 2 and "needs an SLO" in buf.getvalue()
