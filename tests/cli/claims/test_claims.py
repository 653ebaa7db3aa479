"""`bench claims`: the verdict rules, --only, and `bench claims --quick` end to end (every
claim's sweep on the tiny model, its verdict, claims.json, claims.html, --resume)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from rich.console import Console

from bench_cli.claims.catalog import CLAIMS, select
from bench_cli.claims.claim import QUICK_MODEL, Scale, Simulation, scale_rates
from bench_cli.claims.evidence import Point, kv_waste, queue_delays, time_mean
from bench_cli.claims.runner import SimFlags, run_claims
from bench_cli.claims.scheduling import judge_batching
from bench_cli.claims.verdict import (
    FAILS,
    HOLDS,
    PARTLY,
    UNMEASURABLE,
    Part,
    at_least,
    combine,
    factor,
)
from bench_cli.sweep.grid import SweepPoint

VERDICTS = {HOLDS, PARTLY, FAILS, UNMEASURABLE}


def test_a_factor_claim_holds_at_ninety_percent_of_its_factor() -> None:
    assert factor(3.6, 4) == HOLDS and factor(10.0, 4) == HOLDS
    assert factor(3.5, 4) == PARTLY and factor(1.11, 4) == PARTLY
    assert factor(1.1, 4) == FAILS and factor(0.5, 2) == FAILS
    assert factor(None, 2) == UNMEASURABLE


def test_a_percentage_claim_holds_at_its_number() -> None:
    assert at_least(0.70, 0.70, 0.07) == HOLDS
    assert at_least(0.69, 0.70, 0.07) == PARTLY
    assert at_least(0.07, 0.70, 0.07) == FAILS


def test_a_claim_holds_only_when_every_part_holds() -> None:
    def parts(*verdicts: str) -> list[Part]:
        return [Part("x", "1", ">= 1", v) for v in verdicts]

    assert combine(parts(HOLDS, HOLDS)) == HOLDS
    assert combine(parts(HOLDS, FAILS)) == PARTLY
    assert combine(parts(FAILS, PARTLY)) == PARTLY
    assert combine(parts(FAILS, FAILS)) == FAILS
    assert combine(parts(UNMEASURABLE, HOLDS)) == HOLDS
    assert combine(parts(UNMEASURABLE)) == UNMEASURABLE


def test_only_selects_by_id_or_number_and_refuses_unknown_ones() -> None:
    assert [c.id for c in select("1,7")] == ["1", "7a", "7b", "7c", "7d"]
    assert [c.id for c in select("7b")] == ["7b"]
    assert len(select(None)) == len(CLAIMS)
    with pytest.raises(ValueError, match="no claim 9"):
        select("1,9")


def test_every_claim_states_its_thresholds_before_it_runs() -> None:
    for claim in CLAIMS:
        assert claim.missing or claim.thresholds, claim.id
        assert claim.missing or (claim.sweep and claim.judge), claim.id


def step(dur: float, **keys: object) -> dict[str, object]:
    return {"dur_s": dur} | keys


def test_step_statistics_weigh_each_step_by_its_duration() -> None:
    steps = [
        step(3.0, running=4, kv_blocks_used=4, kv_tokens=16, queue_s=[0.5, 1.5]),
        step(1.0, running=8, kv_blocks_used=8, kv_tokens=128, queue_s=[]),
    ]
    assert time_mean(steps, "running") == pytest.approx((3 * 4 + 8) / 4)
    # reserved 3 x 64 + 1 x 128 token-seconds, held 3 x 16 + 128
    assert kv_waste(steps, 16) == pytest.approx(1 - (48 + 128) / (192 + 128))
    assert queue_delays(steps) == [0.5, 1.5]


def test_the_batching_verdict_is_partly_when_it_holds_at_some_rates_only() -> None:
    def point(i: int, batching: str, rate: float, queue: float) -> Point:
        p = SweepPoint(i, {"batching": batching, "rate": rate}, {})
        summary = {"ttft_s": {"mean": queue}, "output_throughput": 1.0}
        return Point(p, Path("."), summary, {}, [step(1.0, queue_s=[queue])])

    points = [
        point(0, "static", 1, 1.0),
        point(1, "continuous", 1, 0.1),  # 90 % less
        point(2, "static", 2, 1.0),
        point(3, "continuous", 2, 0.5),  # 50 % less
    ]
    found = judge_batching(points, Scale.of(True, None, None), Path("."))
    assert found.verdict == PARTLY
    assert "90 % at 1 req/s" in found.measured and "50 % at 2 req/s" in found.measured
    assert found.figures["rates"]["2"]["queue_cut"] == pytest.approx(0.5)
    points[3] = point(3, "continuous", 2, 0.2)
    assert judge_batching(points, Scale.of(True, None, None), Path(".")).verdict == HOLDS


def claims(tmp_path: Path, *args: str | None, **kw: str | None) -> tuple[int, str]:
    """As `bench claims` calls it, with the lag limit a busy test machine needs (a run whose
    load generator falls behind is INVALID, and its claim not measured)."""
    buf = io.StringIO()
    console = Console(file=buf, width=160)
    options = {"only": None, "quick": True, "model": None, "base_url": None, "out": None}
    options |= {"resume": None, "sim": None, "max_p99_lag_ms": 1000.0} | kw
    code = run_claims(
        options["only"],
        bool(options["quick"]),
        options["model"],
        options["base_url"],
        options["out"],
        options["resume"],
        False,
        console,
        options["sim"],  # type: ignore[arg-type]
        options["max_p99_lag_ms"],  # type: ignore[arg-type]
    )
    return code, buf.getvalue()


def test_simulated_claims_scale_every_arrival_rate() -> None:
    keys = {"rate": 0.5, "class": [{"rate": 2, "input_len": "8"}], "sweep": {"rate": [1, 4]}}
    keys["concurrency"] = 8
    scaled = scale_rates(keys, 10.0)
    assert scaled == {
        "rate": 5.0,
        "class": [{"rate": 20.0, "input_len": "8"}],
        "sweep": {"rate": [10.0, 40.0]},
        "concurrency": 8,  # a closed loop keeps its users
    }
    sim = Scale.of(False, None, None, Simulation("h100", "roofline", rate_factor=10.0))
    profile = sim.profile("x", rate=0.25)
    assert profile["rate"] == 2.5 and profile["engine"] == "sim"
    assert profile["sim_device"] == "h100" and profile["sim_cost_model"] == "roofline"
    assert "enforce_eager" not in Scale.of(True, None, None, Simulation()).profile("x")


def test_simulated_claims_size_their_loads_to_the_simulated_device() -> None:
    flags = SimFlags("sim", "h100", "roofline")
    sim = flags.simulation(False, "meta-llama/Llama-3.1-8B", None, Console(file=io.StringIO()))
    assert sim is not None and sim.rate_factor > 1  # an H100 serves 8B faster than 2 cores 135M
    here = SimFlags("sim").simulation(False, None, None, Console(file=io.StringIO()))
    assert here == Simulation("local", rate_factor=1.0)
    with pytest.raises(ValueError, match="only with --engine sim"):
        SimFlags(None, "h100").simulation(False, None, None, Console(file=io.StringIO()))
    with pytest.raises(ValueError, match="no --base-url"):
        SimFlags("sim").simulation(False, None, "http://x", Console(file=io.StringIO()))


def test_simulated_claims_run_in_seconds_and_say_so(tmp_path: Path) -> None:
    out = tmp_path / "claims"
    code, printed = claims(tmp_path, out=str(out), sim=SimFlags("sim", cost_model="roofline"))
    assert code == 0, printed
    record = json.loads((out / "claims.json").read_text())
    assert record["simulation"]["device"] == "local"
    for claim in CLAIMS:
        found = record["findings"][claim.id]
        if claim.missing or claim.not_simulated:
            assert found["verdict"] == UNMEASURABLE
            assert claim.missing or "not simulated" in found["why"]
            continue
        assert found["verdict"] != UNMEASURABLE, (claim.id, found)
        config = next((out / f"{claim.id}-{claim.slug}" / "sweep").glob("p*/config.json"))
        assert json.loads(config.read_text())["engine"]["simulated"], claim.id
    assert "Claims SIMULATED on local" in printed and "predicted" in printed
    assert "SIMULATED" in (out / "claims.html").read_text()
    code, printed = claims(tmp_path, resume=str(out))  # the real engine: not the same run
    assert code == 2 and "simulation" in printed


def test_tensor_parallelism_is_shown_on_simulated_gpus(tmp_path: Path) -> None:
    """7d: Llama-3.1-70B refused on 1 and 2 simulated H100s (as `bench run --engine sim`
    refuses it), served on 4, and faster on 8."""
    out = tmp_path / "claims"
    sim = SimFlags("sim", "h100", "roofline")
    code, printed = claims(tmp_path, only="7d", out=str(out), sim=sim)
    assert code == 0, printed
    found = json.loads((out / "claims.json").read_text())["findings"]["7d"]
    assert found["verdict"] == HOLDS, found
    fit = found["figures"]["fit"]
    assert fit["model"] == "meta-llama/Llama-3.1-70B" and fit["fewest_devices"] == 4
    assert len(fit["refused"]) == 2 and all("do not fit" in r for r in fit["refused"])
    assert found["figures"]["tp4"]["completed"] == 8 and found["figures"]["tpot_factor"] > 1.3
    for config in (out / "7d-tensor-parallel" / "sweep").glob("p*/config.json"):
        engine = json.loads(config.read_text())["engine"]
        assert engine["simulated"] and engine["tensor_parallel_size"] in (4, 8)
    # Every header names the model 7d ran, not the claims' own (which it did not run)
    said = "7d meta-llama/Llama-3.1-70B"
    assert f"1 claims (0 done before) on {said} (quick)" in printed
    assert f"Claims SIMULATED on h100 ({said}, quick;" in printed
    assert f"{said} (quick: tiny random model" in (out / "claims.html").read_text()
    assert QUICK_MODEL not in printed
    code, printed = claims(tmp_path, only="7d", out=str(tmp_path / "real"))  # no simulation
    record = json.loads((tmp_path / "real" / "claims.json").read_text())
    assert code == 0 and record["findings"]["7d"]["verdict"] == UNMEASURABLE
    assert "--engine sim" in record["findings"]["7d"]["why"]


def test_claims_about_engine_settings_are_not_measured_against_a_server(tmp_path: Path) -> None:
    out = tmp_path / "claims"
    code, printed = claims(tmp_path, only="1,7d", base_url="http://127.0.0.1:9", out=str(out))
    assert code == 0, printed
    record = json.loads((out / "claims.json").read_text())
    assert record["findings"]["1"]["verdict"] == UNMEASURABLE
    assert "engine settings" in record["findings"]["1"]["why"]
    assert "one device" in record["findings"]["7d"]["why"]
    assert not (out / "1-paging").exists()  # nothing ran


def test_a_claim_that_could_not_run_fails_the_run_and_is_not_kept(tmp_path: Path) -> None:
    out = tmp_path / "claims"
    code, printed = claims(tmp_path, only="7b", model="no-such-model", out=str(out))
    assert code == 1 and "its sweep failed" in printed
    assert json.loads((out / "claims.json").read_text())["findings"] == {}  # --resume retries


def test_a_claim_whose_load_was_not_kept_is_invalid_and_not_kept(tmp_path: Path) -> None:
    """A sweep whose runs fell behind their schedule did not measure the claim's load: the
    claim says INVALID and what to do, and stays to be run again by --resume."""
    out = tmp_path / "claims"
    code, printed = claims(tmp_path, only="7b", out=str(out), max_p99_lag_ms=1e-6)
    assert code == 1 and "INVALID: the load generator fell behind" in printed
    assert "--max-p99-lag-ms" in printed
    record = json.loads((out / "claims.json").read_text())
    assert record["findings"] == {} and record["max_p99_lag_ms"] == 1e-6


@pytest.fixture(scope="module")
def quick(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int, str]:
    out = tmp_path_factory.mktemp("claims") / "quick"
    code, printed = claims(out.parent, out=str(out))
    return out, code, printed


def test_quick_measures_every_claim_the_engine_has(quick: tuple[Path, int, str]) -> None:
    out, code, printed = quick
    assert code == 0, printed
    record = json.loads((out / "claims.json").read_text())
    assert set(record["findings"]) == {c.id for c in CLAIMS}
    assert record["thresholds"]["1"] and record["quick"] and record["model"] == "tiny-smollm2"
    for claim in CLAIMS:
        found = record["findings"][claim.id]
        assert found["verdict"] in VERDICTS
        if claim.missing or claim.only_simulated:
            assert found["verdict"] == UNMEASURABLE
            continue
        assert found["verdict"] != UNMEASURABLE, (claim.id, found)
        assert found["parts"] and found["charts"], claim.id
        sweep = out / f"{claim.id}-{claim.slug}" / "sweep"
        assert (sweep / "sweep.csv").is_file() and (sweep / "report.html").is_file()
    assert "Claims measured here" in printed and "not evidence" in printed


def test_quick_figures_are_what_each_claim_measured(quick: tuple[Path, int, str]) -> None:
    out, _, _ = quick
    found = json.loads((out / "claims.json").read_text())["findings"]
    paging = found["1"]["figures"]
    # a max_model_len reservation holds 4 requests at once in the quick pool
    assert paging["max_len"]["peak_running"] <= 4 < paging["paged"]["peak_running"]
    assert paging["max_len"]["kv_waste"] > paging["paged"]["kv_waste"]
    fp8 = found["5"]["figures"]
    assert fp8["kv_factor"] == pytest.approx(2, rel=0.05)  # same budget, half the bytes
    assert fp8["accuracy"]["model dtype"]["top1_agreement"] == 1.0
    sharing = found["7a"]["figures"]
    assert sharing["shared"]["prefill_tokens"] < sharing["copied"]["prefill_tokens"]


def test_claims_html_draws_each_claims_evidence(quick: tuple[Path, int, str]) -> None:
    out, _, _ = quick
    page = (out / "claims.html").read_text()
    for claim in CLAIMS:
        assert f"{claim.id}. {claim.title}" in page
    assert page.count("plotly-graph-div") >= 9 and "cores" in page  # and the machine stamp


def test_resume_keeps_every_finished_claim(quick: tuple[Path, int, str]) -> None:
    out, _, _ = quick
    before = (out / "claims.json").read_text()
    stamps = {p: p.stat().st_mtime_ns for p in out.rglob("summary.json")}
    code, printed = claims(out.parent, resume=str(out))
    assert code == 0, printed
    assert "10 done before" in printed
    assert {p: p.stat().st_mtime_ns for p in out.rglob("summary.json")} == stamps
    after = json.loads((out / "claims.json").read_text())
    assert after["findings"] == json.loads(before)["findings"]
    code, printed = claims(out.parent, resume=str(out), only="7d")  # a subset: the rest stay
    assert code == 0 and "1 PagedAttention" in printed
    after = json.loads((out / "claims.json").read_text())
    assert after["findings"] == json.loads(before)["findings"] and len(after["resumed"]) == 2
    code, printed = claims(out.parent, resume=str(out), quick=None)  # a full run's settings
    assert code == 2 and "other quick, model" in printed


def test_claims_json_holds_no_credentials_of_the_server(tmp_path: Path) -> None:
    """Issue 41 item 13: a --base-url with user:password@ or ?api_key= is written masked, and
    a resume with the same URL still matches it."""
    from bench_cli.claims.runner import _start

    scale = Scale.of(True, None, "http://u:pw9@h:1/v1?api_key=sk-77")
    _start(tmp_path, scale, [], resuming=False)
    text = (tmp_path / "claims.json").read_text()
    assert "pw9" not in text and "sk-77" not in text
    assert json.loads(text)["base_url"] == "http://***@h:1/v1?api_key=***"
    _start(tmp_path, scale, [], resuming=True)  # the same server: resumes
