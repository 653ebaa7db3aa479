"""Adding an arrival process is one class (issue 42): a toy process, "uniform gaps between
--low-gap and --high-gap seconds", declared once below and registered, reaches `bench run`
(its flags, --arrival and a profile), the schedule, traffic classes, the arrival check, the
gate's load keys and the report's words, with nothing else edited."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from bench_cli.gate.results import Results, load_differences, load_keys
from bench_cli.run.execute import _load_text
from engine.model.loader import load_tokenizer
from loadgen.arrivals import ArrivalProcess, param, register, unregister
from loadgen.config import RunConfig
from loadgen.plan import build_plan
from loadgen.profiles import build_config

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True, slots=True)
class UniformGaps(ArrivalProcess):
    name = "toy"
    description = "uniform gaps between --low-gap and --high-gap seconds"
    low_gap: float = param(0.01, "toy: shortest gap in seconds")
    high_gap: float = param(0.03, "toy: longest gap in seconds")

    def check(self) -> None:
        if not 0 <= self.low_gap < self.high_gap < np.inf:
            raise ValueError(f"low_gap must be >= 0 and below high_gap, got {self.low_gap}")

    def gaps(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return rng.uniform(self.low_gap, self.high_gap, n)

    def gap_cdf(self) -> Callable[[np.ndarray], np.ndarray]:
        return lambda x: np.clip((x - self.low_gap) / (self.high_gap - self.low_gap), 0.0, 1.0)

    @property
    def mean_rate(self) -> float:
        return 2.0 / (self.low_gap + self.high_gap)

    @classmethod
    def describe(cls, settings: Mapping[str, Any], per_s: str = "req/s") -> str:
        return f"toy gaps {settings['low_gap']:g}-{settings['high_gap']:g} s"


REGISTER_AND_RUN = """
import sys
from loadgen.arrivals import register
from tests.loadgen.test_toy_arrival import UniformGaps
register(UniformGaps)
from bench_cli.app import app
app(sys.argv[1:])
"""


@pytest.fixture
def toy() -> Iterator[None]:
    register(UniformGaps)
    yield
    unregister("toy")


def bench(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", REGISTER_AND_RUN, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


def build(profile: dict[str, Any], **flags: Any) -> RunConfig:
    return build_config(profile, flags, set())


def test_bench_run_sends_on_the_toy_schedule_and_checks_and_reports_it(
    tmp_path: Path, mock_server: Callable[..., str]
) -> None:
    assert "--low-gap" in bench("run", "--help").stdout
    url = mock_server("--ttft", "0.001", "--itl", "0.001")
    out = tmp_path / "run"
    args = ["run", "--base-url", url, "--model", "mock", "--num-requests", "30"]
    args += ["--arrival", "toy", "--low-gap", "0.02", "--high-gap", "0.04", "--warmup", "0"]
    args += ["--input-len", "8", "--output-len", "2", "--no-dashboard", "--out", str(out)]
    args += ["--max-p99-lag-ms", "1000"]
    done = bench(*args)
    assert done.returncode == 0, done.stdout + done.stderr
    summary = json.loads((out / "summary.json").read_text())
    check = summary["arrival_check"]
    assert check["process"] == "toy" and check["target_rate"] == pytest.approx(2 / 0.06)
    assert check["ks_vs_target"]["statistic"] is not None  # the toy's gap CDF was used
    records = [json.loads(x) for x in (out / "requests.jsonl").read_text().splitlines()]
    gaps = np.diff(sorted(r["scheduled_s"] for r in records))
    assert len(gaps) == 29 and ((gaps >= 0.02) & (gaps <= 0.04)).all()
    run = json.loads((out / "config.json").read_text())["run"]
    assert (run["arrival"], run["low_gap"], run["high_gap"]) == ("toy", 0.02, 0.04)
    assert "toy gaps 0.02-0.04 s" in (out / "report.html").read_text()


@pytest.mark.usefixtures("toy")
def test_a_profile_sets_the_toys_parameters_and_its_checks_refuse_bad_ones() -> None:
    cfg = build({"arrival": "toy", "low_gap": 1, "high_gap": 2, "num_requests": 4})
    assert (cfg.low_gap, cfg.high_gap) == (1.0, 2.0) and not cfg.closed_loop
    assert _load_text(cfg) == "toy gaps 1-2 s"
    with pytest.raises(ValueError, match="low_gap must be >= 0 and below high_gap"):
        build({"arrival": "toy", "low_gap": 3, "high_gap": 2, "num_requests": 4})
    with pytest.raises(ValueError, match="--low-gap shapes toy arrivals; poisson has none"):
        build({"rate": 1.0, "num_requests": 4}, low_gap=0.5)
    with pytest.raises(ValueError, match="toy arrivals set their own pace"):
        build({"arrival": "toy", "num_requests": 4}, rate=2.0)
    # a toy profile's gaps do not survive --arrival poisson
    toy_profile = {"arrival": "toy", "low_gap": 1, "high_gap": 2, "num_requests": 4}
    assert build(toy_profile, arrival="poisson", rate=1.0).arrival_params == {}


@pytest.mark.usefixtures("toy")
def test_a_traffic_class_runs_on_the_toy_process() -> None:
    classes = ["t:arrival=toy,low_gap=0.1,high_gap=0.2,num_requests=6", "p:rate=2"]
    cfg = build(
        {"rate": 1.0, "num_requests": 3, "input_len": "8", "output_len": "2"}, classes=classes
    )
    toy_class = cfg.classes[0]
    assert (toy_class.rate, toy_class.low_gap) == (None, 0.1)  # the run's rate is not the toy's
    assert toy_class.describe() == "t: toy gaps 0.1-0.2 s"
    assert cfg.to_dict()["classes"][0]["high_gap"] == 0.2
    built = build_plan(cfg, load_tokenizer("smollm2-135m"))
    assert built.class_arrivals["t"].kind == "toy"
    mine = [t for t, s in zip(built.plan.offsets, built.plan.specs, strict=True) if s.cls == "t"]
    gaps = np.diff(mine)
    assert len(mine) == 6 and ((gaps >= 0.1) & (gaps <= 0.2)).all()
    with pytest.raises(ValueError, match="class 'x': burstiness shapes gamma arrivals; toy has"):
        build({"rate": 1.0, "num_requests": 3}, classes=["x:arrival=toy,burstiness=0.5"])


@pytest.mark.usefixtures("toy")
def test_the_gate_compares_the_toys_parameters_between_runs() -> None:
    assert {"low_gap", "high_gap"} <= set(load_keys())

    def results(low: float) -> Results:
        run = build({"arrival": "toy", "low_gap": low, "num_requests": 4}).to_dict()
        return Results([{}], [], "x", {k: run.get(k) for k in load_keys()}, 1)

    assert load_differences(results(0.01), results(0.02)) == ["low_gap: 0.02 -> 0.01"]


def test_the_toy_is_gone_once_unregistered() -> None:
    """The fixture leaves no toy behind for the other tests (their keys and help)."""
    assert "low_gap" not in load_keys()
    with pytest.raises(ValueError, match="arrival 'toy': expected one of poisson, gamma"):
        build({"arrival": "toy", "num_requests": 4})
