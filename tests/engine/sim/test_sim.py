"""The simulated engine (engine/sim, `bench run --engine sim`): the real scheduler's decisions
step for step, a step-time model whose timing is known reproduced exactly by every metric,
the roofline's arithmetic, calibration fits, virtual time, and what the CLI refuses."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import io
import itertools
import json
import random
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from rich.console import Console

from bench_cli.run.execute import execute
from engine.config import EngineConfig
from engine.core.kv_cache_manager import builtin_chain_hashes, chain_hashes
from engine.core.request import SamplingParams
from engine.engine import LLMEngine
from engine.model.cost import StepShape, matmul_params
from engine.model.shapes import model_shape
from engine.sim.clock import VirtualClock
from engine.sim.efficiency_fit import fit_efficiency
from engine.sim.hardware import DEVICES
from engine.sim.sim_engine import SimEngine, size_gpu_kv_cache, step_model_for, weight_bytes
from engine.sim.step_time import Calibrated, Efficiency, Roofline, Terms, fit
from loadgen.profiles import PROFILE_DIR, load_profile
from loadgen.virtual_loop import run_virtual, without_cyclic_gc


@dataclasses.dataclass
class FixedStep:
    """A step-time model whose timing is known: every step takes `s` seconds."""

    s: float = 0.01
    name: str = "fixed"

    def step_time(self, shape: StepShape) -> float:
        return self.s

    def describe(self) -> dict[str, Any]:
        return {"cost_model": self.name, "step_s": self.s}


def _requests(seed: int = 0) -> list[tuple[str, list[int], int]]:
    rng = random.Random(seed)
    return [
        (f"r{i}", [rng.randrange(3, 500) for _ in range(rng.randint(5, 90))], rng.randint(1, 12))
        for i in range(14)
    ]


def _shapes(engine: LLMEngine, requests: list[tuple[str, list[int], int]], path: Path) -> list:
    engine.log_steps(path)
    pending = list(requests)
    for step in range(10_000):
        if pending and step % 3 == 0:  # arrivals between steps
            for rid, ids, out in pending[:2]:
                engine.add_request(rid, ids, SamplingParams(max_tokens=out, ignore_eos=True))
            pending = pending[2:]
        if not pending and not engine.has_unfinished_requests():
            break
        engine.step()
    engine.log_steps(None)
    keys = ("prefill_tokens", "decode_tokens", "seqs", "running", "waiting", "kv_blocks_used",
            "preempted", "cached_tokens", "decode_context_tokens")  # fmt: skip
    return [tuple(row[k] for k in keys) for row in map(json.loads, path.read_text().splitlines())]


@pytest.mark.parametrize(
    "settings",
    [
        {"max_num_seqs": 4, "max_num_batched_tokens": 64},  # chunks, a full batch
        {"num_kv_blocks": 12, "max_num_batched_tokens": 128},  # preemption
        {"batching": "static", "max_num_seqs": 3},
    ],
)
def test_the_simulation_schedules_every_step_as_the_real_engine(
    tmp_path: Path, settings: dict
) -> None:
    kwargs = {"max_model_len": 256, "enforce_eager": True, **settings}
    real = LLMEngine(EngineConfig.from_kwargs("tiny-llama", **kwargs))
    config = EngineConfig.from_kwargs("tiny-llama", **kwargs)
    config.dtype, config.cache.kv_cache_dtype = real.config.dtype, real.config.dtype
    sim = SimEngine(config, model_shape("tiny-llama"), FixedStep(), VirtualClock())
    reqs = _requests()
    real_steps = _shapes(real, reqs, tmp_path / "real.jsonl")
    sim_steps = _shapes(sim, reqs, tmp_path / "sim.jsonl")
    assert len(real_steps) > 20
    assert sim_steps == real_steps
    if "num_kv_blocks" in settings:
        assert any(s[6] for s in real_steps), "the case meant to preempt did not"


def test_the_simulation_hashes_blocks_its_own_way_and_finds_the_same_hits(
    tmp_path: Path,
) -> None:
    """The simulation's prefix cache keys blocks by Python's 64-bit tuple hash (it serves no
    KV; a third of blake2b's time): on prompts sharing prefixes, the same hits step by step."""
    kwargs = {"max_model_len": 256, "enforce_eager": True, "max_num_seqs": 4}
    real = LLMEngine(EngineConfig.from_kwargs("tiny-llama", **kwargs))
    config = EngineConfig.from_kwargs("tiny-llama", **kwargs)
    config.dtype, config.cache.kv_cache_dtype = real.config.dtype, real.config.dtype
    sim = SimEngine(config, model_shape("tiny-llama"), FixedStep(), VirtualClock())
    assert real.kv.hasher is chain_hashes and sim.kv.hasher is builtin_chain_hashes
    rng = random.Random(1)
    prefix = [rng.randrange(3, 500) for _ in range(48)]
    reqs = [
        (
            f"r{i}",
            prefix[: rng.choice([16, 32, 48])] + [rng.randrange(3, 500) for _ in range(20)],
            rng.randint(1, 8),
        )
        for i in range(14)
    ]
    real_steps = _shapes(real, reqs, tmp_path / "real.jsonl")
    assert _shapes(sim, reqs, tmp_path / "sim.jsonl") == real_steps
    assert sum(s[7] for s in real_steps) >= 10 * 16  # cached tokens: the prefixes were hit
    tokens = list(range(64))
    for hasher in (chain_hashes, builtin_chain_hashes):  # chained: in pieces as at once
        whole = hasher(None, tokens, 16)
        assert whole[:2] + hasher(whole[1], tokens[32:], 16) == whole
        assert len(set(whole)) == 4 and hasher(None, [1, *tokens[1:16]], 16)[0] != whole[0]


def test_lazy_decodes_abort_and_outputs_as_stepping(tmp_path: Path) -> None:
    """SimEngine with lazy decodes against one without: the same step log, an abort in the
    middle of the group, and every request's tokens (lazy ones as on_tokens reports them)."""
    kwargs = {"max_model_len": 256, "max_num_seqs": 6, "max_num_batched_tokens": 64}
    runs = []
    for lazy in (True, False):
        config = EngineConfig.from_kwargs("tiny-llama", **kwargs)
        config.dtype = config.cache.kv_cache_dtype = "float32"
        sim = SimEngine(config, model_shape("tiny-llama"), FixedStep(), VirtualClock())
        tokens: Counter[str] = Counter()
        if lazy:
            assert sim.lazy_decodes(functools.partial(_count_lazy, tokens))
        sim.log_steps(tmp_path / f"{lazy}.jsonl")
        finished, first_token = {}, {}
        # The first prompt is one token longer than the budget: its first chunk leaves one.
        for rid, ids, out in [("first", list(range(3, 68)), 9), *_requests(3)]:
            sim.add_request(rid, ids, SamplingParams(max_tokens=out * 5, ignore_eos=True), 0.0)
        for step in itertools.count():
            if step == 12:
                assert not lazy or sim.lazy.members, "nobody decodes lazily to abort"  # type: ignore[union-attr]
                victim = sim.scheduler.running[1].request_id
                out = sim.abort_request(victim)
                assert out is not None
                finished[victim] = len(out.outputs[0].token_ids)
            if not sim.has_unfinished_requests():
                break
            for o in sim.step():
                tokens[o.request_id] += len(o.new_token_ids)
                if o.finished:
                    finished[o.request_id] = len(o.outputs[0].token_ids)
                    first_token[o.request_id] = o.metrics.first_token_time
        sim.log_steps(None)
        log = _lines(tmp_path / f"{lazy}.jsonl")
        runs.append((log, finished, tokens, first_token, sim.stats()))
    (lazy_log, lazy_done, lazy_tokens, *lazy_rest), (step_log, step_done, step_tokens, *rest) = runs
    assert lazy_log == step_log and lazy_done == step_done and len(lazy_done) == 15
    assert lazy_tokens == step_tokens == lazy_done
    assert lazy_rest == rest  # first-token times, counters


def _count_lazy(tokens: Counter[str], req: Any, first: int, stop: int) -> None:
    tokens[req.request_id] += stop - first


def test_virtual_time_jumps_to_each_timer_in_order() -> None:
    clock = VirtualClock()
    seen: list[tuple[str, float]] = []

    async def sleeper(name: str, s: float) -> None:
        await asyncio.sleep(s)
        seen.append((name, clock.now))

    async def main() -> None:
        await asyncio.gather(sleeper("hour", 3600), sleeper("ms", 0.001), sleeper("min", 60))

    run_virtual(main(), clock)
    assert seen == [("ms", 0.001), ("min", 60.0), ("hour", 3600.0)]


SIM = {
    "model": "tiny-llama",
    "tokenizer": "smollm2-135m",
    "engine_kind": "sim",
    "sim_device": "h100",
    "rate": 5.0,
    "num_requests": 20,
    "warmup": 1,
    "input_len": "uniform:8:200",
    "output_len": "uniform:2:20",
    "seed": 3,
}


def sim_run(tmp_path: Path, **flags: Any) -> tuple[int, str, Path]:
    out = tmp_path / "run"
    buf = io.StringIO()
    flags = {**SIM, "out": str(out), **flags}
    rc = execute("default", flags, dashboard=True, console=Console(file=buf, width=150))
    return rc, buf.getvalue(), out


def test_known_step_times_come_out_exactly_in_every_metric(tmp_path: Path, monkeypatch) -> None:
    """Steps of exactly 10 ms, requests far apart (each runs alone): TTFT is one step (the
    prompt fits the budget), ITL and TPOT 10 ms, E2E output_len steps."""
    import loadgen.sim_setup as setup

    monkeypatch.setattr(setup, "step_model_for", lambda *a, **k: FixedStep(0.01))
    rc, printed, out = sim_run(tmp_path, rate=0.5, num_requests=8)
    assert rc == 0, printed
    summary = json.loads((out / "summary.json").read_text())
    assert summary["completed"] == 8
    for key, stat in (("ttft_s", "min"), ("ttft_s", "max"), ("tpot_s", "p50"), ("itl_s", "max")):
        values = summary[key]
        assert values.get(stat, values["max"]) == pytest.approx(0.01, rel=1e-9), key
    for r in map(json.loads, (out / "requests.jsonl").read_text().splitlines()):
        assert r["end_s"] - r["send_s"] == pytest.approx(0.01 * r["output_tokens"], rel=1e-9)
    assert summary["schedule_lag_s"]["max"] == pytest.approx(0.0, abs=1e-9)


@pytest.mark.parametrize(("model", "checked"), [("tiny-llama", False), ("smollm2-135m", True)])
def test_prompt_ids_fit_the_simulated_vocabulary(
    tmp_path: Path, monkeypatch, model: str, checked: bool
) -> None:
    """Prompts from the tokenizer's words: folded into a smaller simulated vocabulary (tiny
    Llama's 512) and checked by the engine; left unchecked only where every word fits."""
    seen: list[tuple[int, bool]] = []
    real = SimEngine.make_request

    def make_request(self, rid, ids, *args: Any) -> Any:
        seen.append((max(ids), args[-1]))
        return real(self, rid, ids, *args)

    monkeypatch.setattr(SimEngine, "make_request", make_request)
    rc, printed, _ = sim_run(tmp_path, model=model, num_requests=6)
    assert rc == 0, printed
    vocab = model_shape(model).vocab_size
    assert len(seen) >= 6 and all(top < vocab and flag is checked for top, flag in seen)
    if not checked:
        assert vocab == 512


def test_a_simulated_run_pauses_the_cyclic_collector_and_restores_it(
    tmp_path: Path, monkeypatch
) -> None:
    import gc

    import loadgen.benchmark as benchmark

    seen = []
    measure = benchmark.measure
    monkeypatch.setattr(
        benchmark, "measure", lambda *a, **k: (seen.append(gc.isenabled()), measure(*a, **k))[1]
    )
    assert gc.isenabled()
    rc, printed, _ = sim_run(tmp_path)
    assert rc == 0, printed
    assert seen == [False] and gc.isenabled()  # off for the run, back on after
    gc.disable()
    try:
        with without_cyclic_gc():
            pass
        assert not gc.isenabled()  # a caller's own choice is kept
    finally:
        gc.enable()


def test_bench_run_engine_sim_is_marked_simulated_everywhere(tmp_path: Path) -> None:
    rc, printed, out = sim_run(tmp_path)
    assert rc == 0, printed
    assert "SIMULATED tiny-llama on h100 (roofline step times)" in printed
    config = json.loads((out / "config.json").read_text())
    assert config["target"]["kind"] == "simulated"
    assert config["engine"]["simulated"] and config["engine"]["sim"]["cost_model"] == "roofline"
    assert config["engine"]["sim"]["device"]["name"] == "h100"
    assert config["device_peak"]["device"] == "simulated h100"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["completed"] == 20 and summary["failed"] == 0
    html = (out / "report.html").read_text()
    assert "SIMULATED" in html
    steps = [json.loads(x) for x in (out / "steps.jsonl").read_text().splitlines()]
    assert steps and all(s["dur_s"] > 0 for s in steps)


def test_closed_loop_and_conversations_run_in_virtual_time(tmp_path: Path) -> None:
    rc, printed, out = sim_run(tmp_path, rate=None, concurrency=3, turns="3", num_requests=4)
    assert rc == 0, printed
    records = [json.loads(x) for x in (out / "requests.jsonl").read_text().splitlines()]
    measured = [r for r in records if not r["warmup"]]
    assert len(measured) == 12 and all(r["status"] == "ok" for r in measured)
    by_session: dict[int, list[dict]] = {}
    for r in measured:
        by_session.setdefault(r["session"], []).append(r)
    for turns in by_session.values():
        turns.sort(key=lambda r: r["turn"])
        for a, b in itertools.pairwise(turns):  # the reply is in the next prompt
            assert b["prompt_tokens"] >= a["prompt_tokens"] + a["output_tokens"]
            assert b["send_s"] >= a["end_s"]


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        ({"engine_kind": "bundled"}, "simulation settings need --engine sim"),
        ({"base_url": "http://127.0.0.1:9"}, "not with --base-url"),
        ({"sim_device": "tpu"}, "sim device 'tpu'"),
        ({"sim_cost_model": "magic"}, "--sim-cost-model 'magic'"),
        ({"speculative_config": '{"method": "ngram"}'}, "give --sim-acceptance"),
        ({"speculative_config": '{"method": "ngram"}', "sim_acceptance": "0.9,0.5"}, "give 4"),
        ({"sim_acceptance": "0.5,0.7"}, "cannot rise"),
        ({"sim_draft_share": "half"}, "--sim-draft-share 'half'"),
        ({"model": "meta-llama/Llama-3.1-70B", "sim_device": "a100"}, "do not fit on 1 x a100"),
    ],
)
def test_bad_simulation_settings_are_refused(tmp_path: Path, flags: dict, message: str) -> None:
    rc, printed, _ = sim_run(tmp_path, **flags)
    assert rc == 2 and message in " ".join(printed.split()), printed


def test_roofline_arithmetic() -> None:
    model = model_shape("meta-llama/Llama-3.1-8B")
    eff = Efficiency(overhead_s=0.0)
    h100 = Roofline(model, DEVICES["h100"], eff=eff)
    decode = StepShape(0, 1, 1, 128, 128, 0, 1)
    params = matmul_params(model)
    head = model.hidden_size * model.vocab_size
    kv = 2 * model.num_layers * model.num_kv_heads * model.head_dim * 2
    bw = 3350e9 * eff.memory
    expected = (params * 2 + head * 2 + kv * 128 + kv) / bw
    assert h100.step_time(decode) == pytest.approx(expected, rel=1e-9)
    # H200: same compute, 4.8 / 3.35 the bandwidth: a decode step that much faster.
    h200 = Roofline(model, DEVICES["h200"], eff=eff)
    assert h100.step_time(decode) / h200.step_time(decode) == pytest.approx(4.8 / 3.35)
    # A 4096-token prefill chunk is compute-bound: 2 FLOPs a weight a token, at 70 % of peak.
    prefill = StepShape(4096, 0, 1, 4096, 0, 4096 * 4097 // 2, 1)
    linears = 2 * params * 4096 / (989e12 * eff.compute)
    assert h100.step_time(prefill) > linears
    assert h100.step_time(prefill) < 1.5 * linears
    # fp8 weights: half the bytes (decode), twice the peak (prefill) on H100; A100 has no fp8.
    fp8 = Roofline(model, DEVICES["h100"], weight_dtype="fp8", eff=eff)
    assert fp8.step_time(decode) < 0.6 * h100.step_time(decode)
    assert fp8.step_time(prefill) < 0.7 * h100.step_time(prefill)
    a100 = Roofline(model, DEVICES["a100"], eff=eff)
    a100_fp8 = Roofline(model, DEVICES["a100"], weight_dtype="fp8", eff=eff)
    assert a100_fp8.step_time(prefill) == pytest.approx(a100.step_time(prefill), rel=0.05)
    # TP=4: a quarter of the weights per rank, plus two all-reduces a layer.
    big = model_shape("meta-llama/Llama-3.1-70B")
    one, four = (Roofline(big, DEVICES["h200"], tp=t, eff=eff) for t in (1, 4))
    assert 0.25 < four.step_time(decode) / one.step_time(decode) < 0.35


def test_gpu_kv_cache_is_what_vllm_would_take() -> None:
    model = model_shape("meta-llama/Llama-3.1-70B")
    config = EngineConfig.from_kwargs("meta-llama/Llama-3.1-70B", tensor_parallel_size=4)
    config.dtype = config.cache.kv_cache_dtype = "bfloat16"
    size_gpu_kv_cache(config, model, DEVICES["h200"])
    weights = weight_bytes(model, config)
    assert 139e9 < weights < 143e9  # 70.6 B parameters in bf16
    free = 0.9 * 141e9 * 4 - weights - 4 * 2 * 2**30
    assert config.cache.kv_cache_memory_gb == pytest.approx(free / 2**30, abs=0.01)


def _rows(model: Calibrated, n: int = 300, seed: int = 0) -> list[dict[str, Any]]:
    rng = np.random.default_rng(seed)
    rows, t = [], 0.0
    for _ in range(n):
        seqs = int(rng.integers(1, 40))
        prefill = int(rng.integers(0, 600)) if rng.random() < 0.4 else 0
        ctx = int(rng.integers(10, 400)) * seqs
        pairs = prefill * int(rng.integers(0, 300)) + prefill * (prefill + 1) // 2
        shape = StepShape(prefill, seqs, seqs + (prefill > 0), ctx, ctx, pairs, seqs)
        dur = model.step_time(shape) - model.gap_s
        rows.append({"t": t, "dur_s": dur, "running": 1, **shape.as_dict()})
        t += dur + model.gap_s
    return rows


def test_calibration_recovers_a_known_step_time_model() -> None:
    """Steps timed by a known model (a knee, a bend, per-sequence, context and attention
    costs): the fit predicts other steps of it exactly (its coefficients need not be the
    same: several decompositions give one curve)."""
    decode = Terms(0.030, 0.0012, 16.0, 0.002, 1e-6, 0.0, [0.0, 0.004, 0.0, 0.0, 0.0])
    prefill = Terms(0.05, 0.002, 1.0, 0.0, 0.0, 2e-9)
    truth = Calibrated(decode, prefill, gap_s=0.003)
    got = fit(_rows(truth))
    assert got.gap_s == pytest.approx(truth.gap_s, rel=1e-6)
    for row in _rows(truth, seed=1):
        shape = StepShape(**{f: row[f] for f in StepShape.__slots__})
        assert got.step_time(shape) == pytest.approx(truth.step_time(shape), rel=1e-6)
    assert got.fit["mean_abs_rel_err"] < 1e-6


def test_calibration_profile_round_trips_and_guards_its_settings(tmp_path: Path) -> None:
    terms = Terms(0.03, 0.001, 8.0, 0.002, 1e-6, 1e-9)
    truth = Calibrated(terms, terms, settings={"dtype": "float32"})
    path = truth.save(tmp_path / "p.json")
    assert Calibrated.load(path) == truth
    truth.check_settings({"dtype": "float32"})
    with pytest.raises(ValueError, match="dtype='bfloat16' \\(calibrated with 'float32'\\)"):
        truth.check_settings({"dtype": "bfloat16"})
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(ValueError, match="calibration profile"):
        Calibrated.load(tmp_path / "bad.json")
    with pytest.raises(ValueError, match="too few"):
        fit(_rows(truth, n=5))


def test_roofline_efficiencies_are_recovered_from_steps_and_used_on_their_device() -> None:
    """Steps timed by a roofline of known efficiencies (a device where decodes stream weights
    and chunks compute): the fit finds them, and a profile that carries them sets the
    roofline of that device only."""
    model = model_shape("meta-llama/Llama-3.1-8B")
    truth = Efficiency(compute=0.45, memory=0.6, attention=0.2, overhead_s=0.004)
    rows = _rows(Calibrated(Terms(0, 0, 1, 0, 0, 0), Terms(0, 0, 1, 0, 0, 0)))
    device = DEVICES["a100"]
    known = Roofline(model, device, eff=truth)
    for row in rows:
        row["dur_s"] = known.step_time(StepShape(**{f: row[f] for f in StepShape.__slots__}))
    got, err = fit_efficiency(rows[:200], Roofline(model, device), gap_s=0.0)
    assert err < 0.005
    for name in ("compute", "memory", "attention", "overhead_s"):
        assert getattr(got, name) == pytest.approx(getattr(truth, name), rel=0.03), name
    profile = Calibrated(Terms(0, 0, 1, 0, 0, 0), Terms(0, 0, 1, 0, 0, 0))
    profile.roofline = {"device": "a100", "efficiency": dataclasses.asdict(got), "error": err}
    config = EngineConfig.from_kwargs("meta-llama/Llama-3.1-8B")
    config.dtype = config.cache.kv_cache_dtype = "bfloat16"
    fitted = step_model_for("roofline", model, config, device, profile)
    assert isinstance(fitted, Roofline) and fitted.eff == got
    assert "bench calibrate" in fitted.describe()["efficiency_source"]
    for row in rows[200:]:  # steps the fit did not see
        shape = StepShape(**{f: row[f] for f in StepShape.__slots__})
        assert fitted.step_time(shape) == pytest.approx(row["dur_s"], rel=0.02)
    other = step_model_for("roofline", model, config, DEVICES["h100"], profile)
    assert isinstance(other, Roofline) and other.eff == Efficiency()  # not measured there


def test_model_shapes_from_builtins_and_config_json(tmp_path: Path) -> None:
    big = model_shape("meta-llama/Llama-3.1-70B")
    assert (big.num_layers, big.hidden_size, big.num_kv_heads) == (80, 8192, 8)
    hf = {
        "vocab_size": 1000, "hidden_size": 256, "intermediate_size": 512,
        "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 2,
        "rope_scaling": {"rope_type": "llama3"},
    }  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(hf))
    for name in (str(tmp_path), str(tmp_path / "config.json")):
        shape = model_shape(name)
        assert (shape.num_layers, shape.head_dim, shape.num_kv_heads) == (4, 32, 2)
    assert model_shape("smollm2-135m").num_layers == 30  # GGUF metadata, no weights read


def _count(outputs: Any, taken: list) -> Any:
    if outputs is not None:
        taken.append(1)
    return outputs


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text().splitlines()]


def _same(a: Any, b: Any, where: str) -> None:
    if isinstance(a, float) or isinstance(b, float):
        assert a == pytest.approx(b, rel=1e-9, abs=1e-12), where
    elif isinstance(a, list) and isinstance(b, list):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _same(x, y, f"{where}[{i}]")
    elif isinstance(a, dict) and isinstance(b, dict):
        assert a.keys() == b.keys(), where
        for k in a:
            _same(a[k], b[k], f"{where}.{k}")
    else:
        assert a == b, where


@pytest.mark.parametrize(
    "flags",
    [
        {"rate": 3.0, "shared_prefix_len": 40, "max_num_seqs": 4},  # a full batch, a queue
        {"rate": None, "concurrency": 5, "num_kv_blocks": 40},  # closed loop, tight pool
        {"batching": "static", "max_num_seqs": 3, "rate": 8.0},
        {"n": 3, "rate": 2.0},
        # Lazy decodes beside prompts chunked over several steps, and a queue.
        {"rate": 2000.0, "num_requests": 60, "input_len": "uniform:40:300"}
        | {"max_num_batched_tokens": 96, "max_num_seqs": 24},
        {"rate": 2000.0, "num_requests": 60, "num_kv_blocks": 64},  # preemption mid-group
        {"rate": 400.0, "max_model_len": 100, "input_len": 50, "output_len": 80},  # length cap
    ],
)
def test_fast_paths_give_what_every_step_in_turn_gives(
    tmp_path: Path, monkeypatch, flags: dict
) -> None:
    """The fast paths (lazy decodes, SimEngine.decode_stretch) change nothing but the
    simulation's speed: every record's token stamps and every step log line as stepping
    every request one step at a time."""
    from engine.sim.lazy_decodes import LazyDecodes
    from loadgen.sim_backend import SimBackend

    lazy_steps = []
    real_step = LazyDecodes.step
    monkeypatch.setattr(LazyDecodes, "step", lambda self: _count(real_step(self), lazy_steps))
    flags = {"output_len": "uniform:20:70", "max_model_len": 512, **flags}
    rc, printed, fast = sim_run(tmp_path / "fast", **flags)
    assert rc == 0, printed
    if flags.get("batching") != "static" and flags.get("n", 1) == 1:
        assert len(lazy_steps) > 50, "the lazy path did not run"
    monkeypatch.setattr(SimBackend, "fast_forward", False)
    rc, printed, slow = sim_run(tmp_path / "slow", **flags)
    assert rc == 0, printed
    slow_steps, fast_steps = _lines(slow / "steps.jsonl"), _lines(fast / "steps.jsonl")
    assert len(slow_steps) > 100
    if flags.get("num_kv_blocks") == 64:
        assert sum(s["preempted"] for s in slow_steps) > 5, "the case meant to preempt did not"
    _same(fast_steps, slow_steps, "steps")
    _same(_lines(fast / "requests.jsonl"), _lines(slow / "requests.jsonl"), "requests")


@pytest.mark.parametrize(
    "flags",
    [
        {"rate": 2000.0, "num_requests": 60, "input_len": "uniform:40:300"},  # lazy, stretches
        {"n": 3, "rate": 2.0},
        {"rate": 2000.0, "num_requests": 60, "num_kv_blocks": 64},  # preemption mid-group
    ],
)
def test_the_times_formatted_while_stamping_are_the_records_own(
    tmp_path: Path, monkeypatch, flags: dict
) -> None:
    """requests.jsonl byte for byte as the records format their own times: the texts the
    simulation made as it stamped (TimeTexts) are in the order of, and equal to, chunk_s."""
    from loadgen.records import TimeTexts

    flags = {"output_len": "uniform:20:70", "max_model_len": 512, **flags}
    taken, real_take = [], TimeTexts.take
    monkeypatch.setattr(TimeTexts, "take", lambda self, rec: _count(real_take(self, rec), taken))
    rc, printed, made = sim_run(tmp_path / "made", **flags)
    assert rc == 0, printed
    made_text = (made / "requests.jsonl").read_text()
    assert len(taken) == made_text.count("\n") > 10, "a record's times were not made"
    monkeypatch.setattr(TimeTexts, "take", lambda self, rec: None)
    rc, printed, plain = sim_run(tmp_path / "plain", **flags)
    assert rc == 0, printed
    assert made_text == (plain / "requests.jsonl").read_text()


@pytest.mark.parametrize(
    "name", sorted(p.stem for p in PROFILE_DIR.glob("*.toml") if p.stem != "calibrate")
)
def test_every_profile_runs_simulated(tmp_path: Path, name: str) -> None:
    """Each shipped profile (a sweep's last point), a few requests, on a simulated H100
    (speculative decoding with an acceptance rate given)."""
    from bench_cli.sweep.grid import grid, load_sweep

    flags: dict[str, Any] = {"engine_kind": "sim", "sim_device": "h100", "warmup": 0}
    flags |= {"num_requests": 4, "out": str(tmp_path / "run"), "sim_acceptance": 0.6}
    profile = load_profile(name)
    if "sweep" in profile:
        profile, axes = load_sweep(name)
        flags = grid(axes)[-1].settings | flags
    buf = io.StringIO()
    rc = execute(name, flags, dashboard=False, console=Console(file=buf, width=150))
    assert rc == 0, buf.getvalue()
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["completed"] >= 4 and summary["config"]["target"]["kind"] == "simulated"
    speculates = "speculative_config" in profile | flags
    assert bool(summary["telemetry"].get("spec_drafts")) == speculates
    assert ("--sim-acceptance unused" in buf.getvalue()) != speculates
