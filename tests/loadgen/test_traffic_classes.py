"""Traffic classes: parsing ([[class]] tables and --class flags, inheritance, errors naming the
class and key), each class's own schedule inside the merged one, per-class summaries, and a
two-class `bench run` and `bench sweep` against the mock server."""

from __future__ import annotations

import io
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from rich.console import Console

from bench_cli.run.execute import execute
from bench_cli.sweep.options import SweepOptions
from bench_cli.sweep.row import metrics_of
from bench_cli.sweep.runner import run_sweep
from engine.model.loader import load_tokenizer
from loadgen.arrivals import ks_pvalue, ks_statistic
from loadgen.config import RunConfig
from loadgen.metrics import SLO, summarize, summarize_classes
from loadgen.plan import build_plan
from loadgen.profiles import build_config, load_profile
from loadgen.records import RequestRecord
from loadgen.traffic import parse_class_flag

RUN = {"rate": 1.0, "num_requests": 10, "input_len": "100", "slo": "ttft=2"}
PROFILE = """
rate = 1.0
num_requests = 10
input_len = 100
slo = "ttft=2"

[[class]]
name = "interactive"
rate = 4
output_len = 32
priority = 0
slo = "ttft=0.5,tpot=0.05"

[[class]]
name = "batch"
arrival = "gamma"
burstiness = 0.5
input_len = "uniform:500:1000"
n = 4
priority = 1
num_requests = 3
"""


def build(profile: dict[str, Any], **flags: Any) -> RunConfig:
    return build_config(profile, flags, set())


# ---- parsing ----------------------------------------------------------------------------------


def test_class_tables_inherit_every_run_key_they_do_not_set(tmp_path: Path) -> None:
    path = tmp_path / "mix.toml"
    path.write_text(PROFILE)
    interactive, batch = build(load_profile(str(path))).classes
    assert (interactive.name, interactive.rate, interactive.arrival) == (
        "interactive",
        4.0,
        "poisson",
    )
    assert (interactive.input_len, interactive.output_len) == ("100", "32")
    assert (interactive.num_requests, interactive.n, interactive.priority) == (10, 1, 0)
    assert interactive.slo == "ttft=0.5,tpot=0.05"
    assert (batch.rate, batch.arrival, batch.burstiness) == (1.0, "gamma", 0.5)
    assert (batch.input_len, batch.num_requests, batch.n, batch.priority) == (
        "uniform:500:1000",
        3,
        4,
        1,
    )
    assert batch.slo == "ttft=2"  # the run's


def test_the_class_flag_takes_the_same_keys_as_a_table() -> None:
    flags = [
        "interactive:rate=4,output_len=32,priority=0,slo=ttft=0.5,tpot=0.05",
        "batch:arrival=gamma,burstiness=0.5,input_len=uniform:500:1000,n=4,priority=1,"
        "num_requests=3",
    ]
    from_flags = build(dict(RUN), classes=flags).classes
    from_toml = build(dict(RUN, **{"class": load_profile_text(PROFILE)["class"]})).classes
    assert from_flags == from_toml
    assert parse_class_flag("a:slo=e2e=3,rate=2") == {"name": "a", "slo": "e2e=3", "rate": "2"}


def load_profile_text(text: str) -> dict[str, Any]:
    import tomllib

    return tomllib.loads(text)


def test_class_flags_replace_the_profiles_classes() -> None:
    profile = load_profile_text(PROFILE)
    cfg = build(profile, classes=["only:rate=2"])
    assert [c.name for c in cfg.classes] == ["only"]


def test_a_poisson_class_does_not_inherit_a_gamma_runs_burstiness() -> None:
    cfg = build(
        dict(RUN, arrival="gamma", burstiness=0.3), classes=["p:arrival=poisson", "g:rate=2"]
    )
    assert cfg.classes[0].burstiness is None and cfg.classes[1].burstiness == 0.3


def test_the_recorded_config_lists_the_resolved_classes() -> None:
    cfg = build(dict(RUN), classes=["a:rate=2,n=2"])
    recorded = cfg.to_dict()["classes"]
    assert recorded == [
        {
            "name": "a",
            "arrival": "poisson",
            "rate": 2.0,
            "burstiness": None,
            "num_requests": 10,
            "input_len": "100",
            "output_len": "128",
            "shared_prefix_len": 0,
            "num_prefix_groups": 1,
            "n": 2,
            "priority": None,
            "slo": "ttft=2",
        }
    ]


@pytest.mark.parametrize(
    ("classes", "message"),
    [
        (["a:rate=2,colour=red"], "class 'a': 'colour' is not a class setting"),
        (["a:rate=-1"], "class 'a': rate must be > 0"),
        (["a:rate=fast"], "class 'a': rate 'fast' is not a number"),
        (["a:n=0"], "class 'a': n must be >= 1"),
        (["a:n=1.5"], "class 'a': n '1.5' is not an integer"),
        (["a:priority=high"], "class 'a': priority 'high' is not an integer"),
        (["a:burstiness=0.5"], "class 'a': burstiness shapes gamma arrivals"),
        (["a:arrival=trace"], "class 'a': arrival 'trace'"),
        (["a:input_len=uniform:9:3"], "class 'a': input_len length 'uniform:9:3'"),
        (["a:slo=ttft=fast"], "class 'a': slo SLO"),
        (["a:rate=1", "a:rate=2"], "class 'a' is defined twice"),
        (["a:rate=1,rate=2"], "class 'a': rate is given twice"),
        (["rate=1"], "expected NAME:key=value"),
        (["a.b:rate=1"], "name 'a.b'"),
    ],
)
def test_bad_classes_name_the_class_and_key(classes: list[str], message: str) -> None:
    with pytest.raises(ValueError) as e:
        build(dict(RUN), classes=classes)
    assert message in str(e.value)


def test_a_class_without_a_rate_or_an_end_is_refused() -> None:
    with pytest.raises(ValueError, match="class 'a': rate is not set"):
        build({"num_requests": 5}, classes=["a:input_len=8"])
    with pytest.raises(ValueError, match="class 'a': num_requests is not set"):
        build({"rate": 1.0}, classes=["a:input_len=8"])
    cfg = build({"rate": 1.0, "duration": 5.0}, classes=["a:input_len=8"])
    assert cfg.classes[0].num_requests is None  # ended by the run's duration


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        ({"rate": None, "concurrency": 4}, "a closed loop cannot mix them"),
        ({"trace": "t.jsonl"}, "--trace cannot go with traffic classes"),
        ({"dataset": "sharegpt:x.json", "input_len": None}, "--dataset cannot go with traffic"),
        ({"turns": "3"}, "--turns cannot go with traffic classes"),
    ],
)
def test_what_a_mix_cannot_do_is_refused(flags: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        build(dict(RUN), classes=["a:rate=2"], **flags)


# ---- the merged schedule ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return load_tokenizer("smollm2-135m")


def test_each_class_keeps_its_own_process_and_shape_in_the_merged_plan(tokenizer: Any) -> None:
    classes = [
        "slow:rate=2,input_len=8,output_len=5,priority=0",
        "fast:rate=20,input_len=40,output_len=7,n=3,priority=2",
    ]
    cfg = build({"duration": 60.0, "rate": 1.0}, classes=classes, warmup=4)
    built = build_plan(cfg, tokenizer)
    offsets, specs = built.plan.offsets, list(built.plan.specs)
    assert offsets == sorted(offsets) and len(offsets) == len(specs)
    for name, rate, n_in, n_out, n, priority in (
        ("slow", 2.0, 8, 5, 1, 0),
        ("fast", 20.0, 40, 7, 3, 2),
    ):
        mine = [(t, s) for t, s in zip(offsets, specs, strict=True) if s.cls == name]
        assert all(
            (s.input_len, s.output_len, s.n, s.priority) == (n_in, n_out, n, priority)
            for _, s in mine
        )
        count = len(mine)  # Poisson: 60 s at rate r gives r*60 +- a few sqrt(r*60)
        assert abs(count - rate * 60) < 4 * np.sqrt(rate * 60), (name, count)
        gaps = np.diff([t for t, _ in mine])
        cdf = built.class_arrivals[name].gap_cdf()
        assert cdf is not None
        assert ks_pvalue(ks_statistic(gaps, cdf), len(gaps)) > 0.01, name
    assert [s.cls for s in built.plan.warmup] == ["slow", "fast", "slow", "fast"]
    assert built.plan.probe is not None and built.plan.probe.cls == "slow"
    again = build_plan(build({"duration": 60.0, "rate": 1.0}, classes=classes[1:]), tokenizer)
    fast = [t for t, s in zip(offsets, specs, strict=True) if s.cls == "fast"]
    assert again.plan.offsets == fast  # a class's schedule does not depend on the others'


def test_a_class_with_its_own_count_stops_at_it(tokenizer: Any) -> None:
    cfg = build({"rate": 5.0, "num_requests": 4}, classes=["a:num_requests=9", "b:rate=50"])
    specs = list(build_plan(cfg, tokenizer).plan.specs)
    assert [s.cls for s in specs].count("a") == 9 and [s.cls for s in specs].count("b") == 4


def test_an_open_loop_plan_lets_go_of_each_prompt_it_hands_out(tokenizer: Any) -> None:
    """A simulated hour plans 360,000 prompts (~1 GB): none is held after it was sent."""
    cfg = build({"rate": 50.0, "num_requests": 20})
    specs = build_plan(cfg, tokenizer).plan.specs
    first = next(specs)
    assert sys.getrefcount(first) == 2  # `first` and the call's argument: the plan let go
    assert [first, *specs] == list(build_plan(cfg, tokenizer).plan.specs)  # in order, all


# ---- per-class summaries ---------------------------------------------------------------------


def rec(i: int, cls: str, send: float, ttft: float, chunks: int, gap: float) -> RequestRecord:
    r = RequestRecord(i, f"r{i}", 10, chunks, scheduled_s=send, send_s=send, cls=cls)
    r.chunk_s = [send + ttft + k * gap for k in range(chunks)]
    r.chunk_tokens = [1] * chunks
    r.first_chunk_s, r.end_s = r.chunk_s[0], r.chunk_s[-1]
    r.prompt_tokens, r.output_tokens, r.status = 10, chunks, "ok"
    return r


def test_each_class_is_summarized_on_its_own_records_and_its_own_slo() -> None:
    records = [
        rec(0, "chat", 0.0, 0.1, 5, 0.01),  # TTFT 0.1: inside chat's 0.2 s
        rec(1, "chat", 1.0, 0.3, 5, 0.01),  # TTFT 0.3: outside it
        rec(2, "batch", 0.5, 1.0, 11, 0.05),  # TTFT 1.0: inside batch's 2 s
        rec(3, "batch", 1.5, 3.0, 11, 0.05),  # outside
    ]
    records.append(RequestRecord(4, "r4", 10, 4, scheduled_s=2.0, send_s=2.0, status="error"))
    records[-1].cls = "batch"
    slos = {"chat": SLO(ttft=0.2), "batch": SLO(ttft=2.0)}
    per = summarize_classes(records, 4.0, {}, slos)
    assert list(per) == ["chat", "batch"]
    chat, batch = per["chat"], per["batch"]
    assert (chat["completed"], chat["failed"], batch["completed"], batch["failed"]) == (2, 0, 2, 1)
    assert chat["ttft_s"]["mean"] == pytest.approx(0.2)
    assert batch["ttft_s"]["p50"] == pytest.approx(2.0)
    assert chat["tpot_s"]["mean"] == pytest.approx(0.01)
    assert batch["tpot_s"]["mean"] == pytest.approx(0.05)
    assert chat["output_throughput"] == pytest.approx(10 / 4.0)
    assert batch["request_throughput"] == pytest.approx(2 / 4.0)
    assert chat["goodput"] == pytest.approx(0.25) and batch["goodput"] == pytest.approx(0.25)
    assert chat["slo"] == {"ttft": 0.2} and "definitions" not in chat
    whole = summarize(records, 4.0, slo=SLO(ttft=5.0), class_slos=slos)
    assert whole["goodput"] == pytest.approx(2 / 4.0)  # each request by its class's SLO


def test_sweep_rows_carry_each_classes_headline_metrics() -> None:
    records = [rec(0, "chat", 0.0, 0.1, 5, 0.01), rec(1, "batch", 0.5, 1.0, 11, 0.05)]
    slos = {"chat": SLO(ttft=0.2), "batch": SLO()}
    summary = summarize(records, 2.0, class_slos=slos)
    summary["classes"] = summarize_classes(records, 2.0, {}, slos)
    row = metrics_of(summary)
    assert row["class.chat.ttft_s.p99"] == pytest.approx(0.1)
    assert row["class.batch.tpot_s.p50"] == pytest.approx(0.05)
    assert row["class.chat.slo_attainment"] == 1.0 and row["class.batch.goodput"] is None
    assert row["class.batch.output_throughput"] == pytest.approx(11 / 2.0)


# ---- end to end against the mock server ---------------------------------------------------------


def test_a_two_class_run_reports_each_class(
    tmp_path: Path, mock_server: Callable[..., str]
) -> None:
    url = mock_server("--ttft", "0.002", "--itl", "0.001")
    buf = io.StringIO()
    flags = {
        "base_url": url,
        "model": "mock",
        "warmup": 2,
        "num_requests": 12,
        "max_p99_lag_ms": 1000.0,  # what the run reports, on a machine as busy as CI's
        "out": str(tmp_path / "run"),
        "slo": "ttft=5",
        "classes": [
            "interactive:rate=30,input_len=16,output_len=4,priority=0,slo=ttft=1,tpot=0.5",
            "batch:rate=10,input_len=64,output_len=8,n=3,priority=1,num_requests=6",
        ],
    }
    rc = execute("default", flags, dashboard=False, console=Console(file=buf, width=200))
    printed = buf.getvalue()
    assert rc == 0, printed
    assert "Per class" in printed and "interactive" in printed and "batch" in printed
    run = tmp_path / "run"
    summary = json.loads((run / "summary.json").read_text())
    interactive, batch = summary["classes"]["interactive"], summary["classes"]["batch"]
    assert (interactive["completed"], batch["completed"], summary["completed"]) == (12, 6, 18)
    assert interactive["total_output_tokens"] == 12 * 4
    assert batch["total_output_tokens"] == 6 * 8 * 3  # every choice's tokens
    assert batch["itl_s"]["count"] == 6 * 3 * 7  # gaps within each choice's own chunks
    assert interactive["slo"] == {"ttft": 1.0, "tpot": 0.5} and batch["slo"] == {"ttft": 5.0}
    assert interactive["arrival_check"]["target_rate"] == 30.0
    config = json.loads((run / "config.json").read_text())
    assert [c["name"] for c in config["run"]["classes"]] == ["interactive", "batch"]
    records = [json.loads(line) for line in (run / "requests.jsonl").read_text().splitlines()]
    assert {(r["cls"], r["n"]) for r in records} == {("interactive", 1), ("batch", 3)}
    assert "classes.batch.ttft_s.p99" in pd.read_csv(run / "summary.csv").columns
    page = (run / "report.html").read_text()
    assert "By traffic class" in page and "by traffic class" in page


SWEEP_MIX = """
name = "mix"
model = "mock"
num_requests = 5
warmup = 0
input_len = 16
output_len = 4
max_p99_lag_ms = 1000.0  # a busy machine's lag is not what this checks

[[class]]
name = "chat"
slo = "ttft=2"

[[class]]
name = "bulk"
output_len = 8
n = 2

[sweep]
rate = [20, 40]
"""


def test_sweep_csv_has_per_class_columns(tmp_path: Path, mock_server: Callable[..., str]) -> None:
    url = mock_server("--ttft", "0.002", "--itl", "0.001")
    profile = tmp_path / "mix.toml"
    profile.write_text(SWEEP_MIX)
    flags = {"base_url": url, "model": None, "api_key": None, "name": None}
    flags["out"] = str(tmp_path / "sweep")
    buf = io.StringIO()
    rc = run_sweep(str(profile), flags, SweepOptions(), Console(file=buf, width=160))
    assert rc == 0, buf.getvalue()
    table = pd.read_csv(tmp_path / "sweep" / "sweep.csv")
    assert list(table["rate"]) == [20, 40]
    assert list(table["class.chat.completed"]) == [5, 5]
    assert list(table["class.bulk.completed"]) == [5, 5]
    for col in ("class.chat.ttft_s.p99", "class.bulk.tpot_s.p50", "class.chat.slo_attainment"):
        assert table[col].notna().all(), col
