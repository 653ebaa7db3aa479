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
from typer.testing import CliRunner

from bench_cli.app import app
from bench_cli.sweep.grid import SweepPoint
from bench_cli.sweep.options import SweepOptions
from bench_cli.sweep.runner import run_sweep
from bench_cli.sweep.search import SearchSpec, bisect, run_search


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
    rc = run_sweep(str(tmp_path / "p.toml"), flags, SweepOptions(search="2:8"), console)
    printed = buf.getvalue()
    assert rc == 0, printed
    assert "highest rate with 90% in SLO: none" in printed
    table = pd.read_csv(tmp_path / "s" / "sweep.csv")
    assert list(table["rate"]) == [8.0, 2.0] and list(table["slo_attainment"]) == [0.0, 0.0]
    record = json.loads((tmp_path / "s" / "slo_search.json").read_text())
    assert record["settings"]["all"]["served"] is None
    assert (tmp_path / "s" / "report.html").exists()
    options = SweepOptions(resume=str(tmp_path / "s"), search="2:8")
    again = run_sweep(str(tmp_path / "p.toml"), flags, options, console)
    assert again == 0 and buf.getvalue().count("done before, kept") == 2, buf.getvalue()
    no_slo = PROFILE.replace('slo = "ttft=0.001"\n', "")
    (tmp_path / "q.toml").write_text(no_slo)
    flags["out"] = str(tmp_path / "t")
    rc = run_sweep(str(tmp_path / "q.toml"), flags, SweepOptions(search="2:8"), console)
    assert rc == 2 and "needs an SLO" in buf.getvalue()


def _fake_sweep(curve: Callable[[float], float], sent: int = 40) -> Callable[..., dict]:
    """A point_row for run_search: each rate's row from a made-up attainment curve."""

    def point_row(point: SweepPoint, total: int) -> dict:
        rate = point.values["rate"]
        row = {"point": point.index, "rate": rate, "runs": 1, "completed": sent, "failed": 0}
        return row | {"slo_attainment": curve(rate)}

    return point_row


def _search(tmp: Path, curve: Callable[[float], float], **kw: float) -> tuple[str, dict]:
    buf = io.StringIO()
    rows: list[dict] = []
    code = run_search(
        _fake_sweep(curve),
        SearchSpec(1, 16, 3),
        {},
        rows,
        lambda: None,
        Console(file=buf, width=200),
        tmp,
        **kw,
    )
    assert code is None
    return buf.getvalue(), json.loads((tmp / "slo_search.json").read_text())


def test_the_slo_target_sets_what_the_search_calls_served(tmp_path: Path) -> None:
    def curve(rate: float) -> float:
        return 0.85 if rate <= 6 else 0.3

    printed, record = _search(tmp_path, curve)
    assert "highest rate with 90% in SLO: none" in printed and record["target"] == 0.9
    printed, record = _search(tmp_path, curve, target=0.8)
    assert "highest rate with 80% in SLO: 4.75 req/s (6.625 req/s was not)" in printed
    assert record["target"] == 0.8 and record["settings"]["all"]["served"] == 4.75


def test_a_search_whose_share_in_slo_rises_with_the_rate_is_doubtful(tmp_path: Path) -> None:
    def curve(rate: float) -> float:  # a dip below 6 req/s, more in SLO again above it
        return 0.95 if rate < 2 else 0.5 if rate < 6 else 0.85 if rate < 12 else 0.2

    printed, record = _search(tmp_path, curve)
    assert "1 req/s (2.875 req/s was not) (DOUBTFUL: in SLO rose with the load, " in printed
    assert "50% at rate=2.875 to 85% at rate=8.5" in printed
    assert "rose with the load" in record["settings"]["all"]["doubt"]
    printed, record = _search(tmp_path, lambda r: 0.95 if r < 6 else 0.3)
    assert "DOUBTFUL" not in printed and record["settings"]["all"]["doubt"] is None


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--slo-target", "0"], "--slo-target 0.0: give a share of requests, 0 < x <= 1"),
        (["--slo-target", "1.5"], "--slo-target 1.5: give a share"),
        (["--slo-target", "0.95"], "--slo-target needs an SLO"),
    ],
)
def test_a_bad_or_pointless_slo_target_is_refused_before_anything_runs(
    tmp_path: Path, extra: list[str], message: str
) -> None:
    (tmp_path / "q.toml").write_text(PROFILE.replace('slo = "ttft=0.001"\n', ""))
    args = ["sweep", "--profile", str(tmp_path / "q.toml"), "--rates", "1,2"]
    args += ["--base-url", "http://127.0.0.1:9/v1", "--out", str(tmp_path / "s"), *extra]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2 and message in " ".join(result.output.split()), result.output
    assert not list((tmp_path / "s").glob("p*"))
