"""`bench sweep --rates`: guidellm's automatic sweep (a synchronous point, a throughput point,
rates spaced linearly between their achieved request rates) against the mock server, whose
timing is known, and the explicit rate list."""

from __future__ import annotations

import io
import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from rich.console import Console
from typer.testing import CliRunner

from bench_cli.app import app
from bench_cli.sweep.grid import grid
from bench_cli.sweep.options import SweepOptions
from bench_cli.sweep.rates import RateSpec, anchor_points, apply, auto_axes, between
from bench_cli.sweep.runner import run_sweep
from bench_cli.sweep.table import knee

TTFT, ITL, OUTPUT = 0.02, 0.002, 8
# One request at a time can do no better than this (the mock's own timing, no overhead).
SYNC_CEILING = 1 / (TTFT + (OUTPUT - 1) * ITL)  # ~29 req/s
PROFILE = f"""
name = "auto"
num_requests = 16
warmup = 0
input_len = "16"
output_len = "{OUTPUT}"
max_p99_lag_ms = 1000.0  # what the sweep does, on a busy machine too (INVALID exits 3)
"""


def sweep(tmp: Path, url: str, rates: str, profile: str = PROFILE, **kw: Any) -> tuple[int, str]:
    path = tmp / "profile.toml"
    path.write_text(profile)
    buf = io.StringIO()
    flags = {"base_url": url, "model": None, "api_key": None, "name": None, "out": None}
    flags |= kw.pop("flags", {"out": str(tmp / "sweep")})
    options = SweepOptions(resume=kw.pop("resume", None), rates=rates)
    rc = run_sweep(str(path), flags, options, Console(file=buf, width=160))
    return rc, buf.getvalue()


def run_config(point_dir: Path) -> dict[str, Any]:
    return json.loads((point_dir / "config.json").read_text())["run"]


def test_auto_rates_run_synchronous_throughput_and_rates_between(
    tmp_path: Path, mock_server: Callable[..., str]
) -> None:
    url = mock_server("--ttft", str(TTFT), "--itl", str(ITL))
    rc, printed = sweep(tmp_path, url, "auto:4")
    assert rc == 0, printed
    plan = json.loads((tmp_path / "sweep" / "sweep.json").read_text())
    anchors = plan["anchors"]
    sync = anchors["synchronous"]["request_throughput"]
    thr = anchors["throughput"]["request_throughput"]
    assert 0.5 * SYNC_CEILING < sync <= SYNC_CEILING
    assert thr > 3 * sync  # the mock serves any number at once
    # guidellm: linspace(sync, throughput, N-1)[1:], N-2 = 2 rates, the last at throughput's
    assert anchors["between"] == pytest.approx(np.linspace(sync, thr, 3)[1:], rel=1e-3)
    assert anchors["arrival"] == "poisson" and plan["rates"] == "auto:4"
    assert plan["axes"]["rate"] == [{"label": "sync", "concurrency": 1}, *anchors["between"], "inf"]

    table = pd.read_csv(tmp_path / "sweep" / "sweep.csv")
    assert list(table["rate"]) == ["sync", *(str(r) for r in anchors["between"]), "inf"]
    assert list(table["completed"]) == [16] * 4 and list(table["failed"]) == [0] * 4
    assert table["concurrency"].iloc[0] == 1 and table["concurrency"].iloc[1:].isna().all()
    # the anchors are the sweep's own first and last points, not extra runs
    assert table["request_throughput"].iloc[0] == pytest.approx(sync)
    assert table["request_throughput"].iloc[-1] == pytest.approx(thr)
    dirs = sorted(p for p in (tmp_path / "sweep").iterdir() if p.is_dir())
    assert [d.name for d in dirs] == [
        anchors["synchronous"]["point"],
        *(f"p{i:02d}-rate-{r}" for i, r in enumerate(anchors["between"], start=1)),
        anchors["throughput"]["point"],
    ]
    configs = [run_config(d) for d in dirs]
    assert configs[0]["concurrency"] == 1 and configs[0]["rate"] is None  # a closed loop
    assert [c["rate"] for c in configs[1:]] == [*anchors["between"], "inf"]
    assert {c["arrival"] for c in configs} == {"poisson"}
    assert "anchors: synchronous" in printed and "load: rate=sync" in printed
    assert (tmp_path / "sweep" / "report.html").is_file()


def test_resume_keeps_the_rates_it_started_with(
    tmp_path: Path, mock_server: Callable[..., str]
) -> None:
    url = mock_server("--ttft", str(TTFT), "--itl", str(ITL))
    rc, printed = sweep(tmp_path, url, "auto:3")
    assert rc == 0, printed
    before = json.loads((tmp_path / "sweep" / "sweep.json").read_text())
    # the synchronous anchor's run lost: it runs again as a point, but the rates stay
    (tmp_path / "sweep" / before["anchors"]["synchronous"]["point"] / "summary.json").unlink()
    rc, printed = sweep(tmp_path, url, "auto:3", resume=str(tmp_path / "sweep"), flags={})
    assert rc == 0, printed
    assert "anchors:" not in printed and printed.count("done before, kept") == 2
    after = json.loads((tmp_path / "sweep" / "sweep.json").read_text())
    assert after["anchors"] == before["anchors"] and after["axes"] == before["axes"]
    rc, printed = sweep(tmp_path, url, "auto:4", resume=str(tmp_path / "sweep"), flags={})
    assert rc == 2 and "changed since it started" in printed and "rates" in printed


def test_a_rate_list_replaces_the_profiles_rate_axis(
    tmp_path: Path, mock_server: Callable[..., str]
) -> None:
    url = mock_server("--ttft", "0.001", "--itl", "0.001")
    profile = PROFILE.replace("num_requests = 16", "num_requests = 8") + "[sweep]\nrate = [1]\n"
    rc, printed = sweep(tmp_path, url, "50,100", profile)
    assert rc == 0, printed
    table = pd.read_csv(tmp_path / "sweep" / "sweep.csv")
    assert list(table["rate"]) == [50, 100] and list(table["completed"]) == [8, 8]
    assert "anchors" not in json.loads((tmp_path / "sweep" / "sweep.json").read_text())


def test_auto_needs_three_points_and_a_request_count(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["sweep", "--rates", "auto:2", "--out", str(tmp_path / "x")])
    assert result.exit_code == 2 and "N >= 3" in result.output
    assert not (tmp_path / "x").exists()
    for bad in ("auto", "auto:x", "0,1", "1,fast"):
        with pytest.raises(ValueError, match="--rates"):
            RateSpec.parse(bad)
    assert RateSpec.parse("auto:10").auto == 10
    assert RateSpec.parse("1,2.5,inf").rates == (1.0, 2.5, math.inf)
    rc, printed = sweep(tmp_path, "http://127.0.0.1:9/v1", "auto:3", PROFILE.replace("num_", "#"))
    assert rc == 2 and "must set num_requests" in printed
    result = CliRunner().invoke(app, ["sweep"])
    assert result.exit_code == 2 and "--profile" in result.output


def test_auto_refuses_a_concurrency_axis_and_replaces_a_rate_axis() -> None:
    with pytest.raises(ValueError, match="concurrency"):
        apply(RateSpec.parse("auto:5"), {"concurrency": [1, 8]})
    axes = {"rate": [1, 2], "batching": ["static", "continuous"]}
    assert apply(RateSpec.parse("auto:5"), axes) == {"batching": ["static", "continuous"]}
    assert apply(RateSpec.parse("3,4"), axes) == {"rate": [3.0, 4.0], "batching": axes["batching"]}


def test_between_is_guidellms_linear_spacing() -> None:
    assert between(10.0, 100.0, 5) == [40.0, 70.0, 100.0]
    assert between(10.0, 100.0, 3) == [100.0]
    assert between(1.0, 2.0, 4) == [1.5, 2.0]


def test_anchor_runs_are_the_first_settings_own_points() -> None:
    settings = {"batching": ["static", "continuous"]}
    sync, thr = anchor_points(settings, 5)
    points = grid(auto_axes(settings, [12.0, 23.0, 34.0]))
    assert len(points) == 10
    assert (sync.dirname, thr.dirname) == (points[0].dirname, points[4].dirname)
    assert sync.values == {"batching": "static", "rate": "sync"}
    assert sync.settings == {"batching": "static", "concurrency": 1}
    assert thr.settings == {"batching": "static", "rate": math.inf}


def test_the_knee_orders_the_synchronous_point_below_every_rate() -> None:
    def row(rate: Any, attainment: float) -> dict[str, Any]:
        return {"rate": rate, "slo_attainment": attainment}

    assert knee([row("sync", 1.0), row(40.0, 0.5), row(math.inf, 0.1)], "rate") == "sync"
    assert knee([row("sync", 1.0), row(40.0, 0.95), row(math.inf, 0.1)], "rate") == "40.0"
    served = [row("sync", 1.0), row(40.0, 0.95), row(math.inf, 0.95)]
    assert knee(served, "rate") == "not reached up to inf"
