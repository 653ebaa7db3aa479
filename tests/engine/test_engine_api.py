"""The offline API's contract: vLLM-shaped outputs, stop conditions, sampling, aborts, errors."""

import json
from pathlib import Path

import pytest
import torch

from engine import LLM, SamplingParams
from engine.config import EngineConfig
from engine.engine import LLMEngine


@pytest.fixture(scope="module")
def llm() -> LLM:
    return LLM("tiny-llama", dtype="float32", max_num_seqs=8, num_kv_blocks=40)


def greedy(max_tokens: int, **kw: object) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, **kw)  # type: ignore[arg-type]


def test_outputs_come_back_in_prompt_order_with_timing(llm: LLM) -> None:
    prompts = [[5, 6, 7], [9] * 30, [100, 200]]
    outs = llm.generate(prompts, greedy(5, ignore_eos=True))
    assert [o.prompt_token_ids for o in outs] == prompts
    for o in outs:
        assert o.finished and len(o.outputs[0].token_ids) == 5
        assert o.outputs[0].finish_reason == "length"
        m = o.metrics
        assert m.first_token_time is not None and m.finish_time is not None
        assert m.arrival_time <= m.first_token_time <= m.finish_time


def test_eos_stops_generation_unless_ignored(llm: LLM) -> None:
    prompt = [7, 8, 9]
    free = llm.generate([prompt], greedy(12, ignore_eos=True))[0].outputs[0].token_ids
    eos = free[3]
    engine = llm.llm_engine
    engine.eos_token_ids = (eos,)
    try:
        out = llm.generate([prompt], greedy(12))[0].outputs[0]
        assert out.token_ids == free[: free.index(eos) + 1]
        assert out.finish_reason == "stop" and out.stop_reason is None
        ignored = llm.generate([prompt], greedy(12, ignore_eos=True))[0].outputs[0]
        assert ignored.token_ids == free
    finally:
        engine.eos_token_ids = (1,)


def test_stop_token_ids_stop_and_are_reported(llm: LLM) -> None:
    prompt = [11, 12, 13]
    free = llm.generate([prompt], greedy(10, ignore_eos=True))[0].outputs[0].token_ids
    stop = free[4]
    out = llm.generate([prompt], greedy(10, ignore_eos=True, stop_token_ids=[stop]))[0].outputs[0]
    assert out.token_ids == free[: free.index(stop) + 1]
    assert out.finish_reason == "stop" and out.stop_reason == stop


def test_same_seed_same_sample_regardless_of_batch(llm: LLM) -> None:
    params = SamplingParams(max_tokens=12, temperature=1.0, top_p=0.9, seed=42, ignore_eos=True)
    alone = llm.generate([[3, 4, 5]], params)[0].outputs[0].token_ids
    crowd = llm.generate(
        [[9, 9], [3, 4, 5], [1, 2, 3, 4]], [greedy(20, ignore_eos=True), params, params]
    )
    assert crowd[1].outputs[0].token_ids == alone
    other = SamplingParams(max_tokens=12, temperature=1.0, top_p=0.9, seed=7, ignore_eos=True)
    assert llm.generate([[3, 4, 5]], other)[0].outputs[0].token_ids != alone


def test_top_k_one_is_greedy(llm: LLM) -> None:
    prompt = [21, 22, 23]
    g = llm.generate([prompt], greedy(8, ignore_eos=True))[0].outputs[0].token_ids
    k1 = SamplingParams(max_tokens=8, temperature=5.0, top_k=1, seed=1, ignore_eos=True)
    assert llm.generate([prompt], k1)[0].outputs[0].token_ids == g


def test_abort_frees_blocks_at_once(llm: LLM) -> None:
    engine = llm.llm_engine
    engine.add_request("a", [5] * 40, greedy(50, ignore_eos=True))
    engine.add_request("b", [6] * 40, greedy(3, ignore_eos=True))
    engine.step()
    assert engine.stats()["kv_blocks_used"] > 0
    out = engine.abort_request("a")
    assert out is not None and out.finished and out.outputs[0].finish_reason == "abort"
    assert engine.stats()["kv_blocks_used"] == engine.kv.blocks_for(41)  # only b is left
    while engine.has_unfinished_requests():
        engine.step()
    assert engine.stats()["kv_blocks_used"] == 0
    assert engine.abort_request("a") is None


def test_stats_report_the_engine_state(llm: LLM) -> None:
    stats = llm.llm_engine.stats()
    for key in (
        "num_running",
        "num_waiting",
        "kv_blocks_used",
        "kv_blocks_total",
        "num_preemptions",
        "prefix_cache_hit_rate",
        "last_step_num_tokens",
    ):
        assert key in stats
    assert stats["kv_blocks_total"] == 40


@pytest.mark.parametrize(
    ("prompt", "params", "match"),
    [
        ([], greedy(4), "empty"),
        ([1, 2, 99999], greedy(4), "token ids"),
        ([1] * 2000, greedy(4), "context length"),
        ([1] * 900, greedy(200), "can never fit"),
        ("text", greedy(4), "no tokenizer"),
    ],
)
def test_bad_requests_are_rejected_clearly(
    llm: LLM, prompt: object, params: SamplingParams, match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        llm.llm_engine.add_request("bad", prompt, params)  # type: ignore[arg-type]
    assert not llm.llm_engine.has_unfinished_requests()


def test_bad_sampling_params_are_rejected() -> None:
    for kw in ({"max_tokens": 0}, {"temperature": -1.0}, {"top_p": 0.0}, {"top_k": -2}, {"n": 0}):
        with pytest.raises(ValueError):
            SamplingParams(**kw)  # type: ignore[arg-type]


def test_unknown_engine_argument_is_named() -> None:
    with pytest.raises(TypeError, match="max_num_seq"):
        EngineConfig.from_kwargs("tiny-llama", max_num_seq=4)
    with pytest.raises(ValueError, match="batching"):
        EngineConfig.from_kwargs("tiny-llama", batching="dynamic")


@pytest.mark.slow
def test_stop_strings_cut_the_text_on_a_real_tokenizer() -> None:
    smol = LLM("smollm2-135m", dtype="float32", max_num_seqs=4)
    prompt = "The capital of France is"
    free = smol.generate([prompt], greedy(12))[0].outputs[0]
    tokenizer = smol.get_tokenizer()
    assert tokenizer is not None
    assert free.text == tokenizer.decode(free.token_ids)
    assert "\n" in free.text
    head = free.text[: free.text.index("\n")]
    cut = smol.generate([prompt], greedy(12, stop=["\n"]))[0].outputs[0]
    assert (cut.text, cut.finish_reason, cut.stop_reason) == (head, "stop", "\n")
    kept = smol.generate([prompt], greedy(12, stop=["\n"], include_stop_str_in_output=True))
    assert kept[0].outputs[0].text == head + "\n"


def test_auto_dtype_is_bf16_only_where_the_hardware_runs_it_natively(monkeypatch) -> None:
    """Where it does, the faster of the two by measurement (tests/engine/ops/test_cpu_bf16.py)."""
    import torch

    from engine.dtype_choice import choose_dtype
    from engine.engine import cpu_has_native_bf16
    from engine.resolve import resolve_dtype

    cpu = torch.device("cpu")
    assert resolve_dtype("auto", cpu) == "float32"  # SERVEBENCH_CPU_BF16=0 (conftest)
    monkeypatch.delenv("SERVEBENCH_CPU_BF16")
    flags = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").is_file() else ""
    native = any(f in flags.split() for f in ("avx512_bf16", "amx_bf16", "bf16"))
    assert cpu_has_native_bf16() == native
    assert resolve_dtype("auto", cpu) == (choose_dtype(cpu).dtype if native else "float32")
    monkeypatch.setenv("SERVEBENCH_CPU_BF16", "0")
    assert resolve_dtype("auto", torch.device("cuda")) == "bfloat16"
    assert resolve_dtype("float32", torch.device("cuda")) == "float32"
    llm = LLM("tiny-llama", num_kv_blocks=8)
    assert llm.llm_engine.config.dtype in ("bfloat16", "float32")  # recorded as resolved
    with pytest.raises(ValueError, match="dtype"):
        EngineConfig.from_kwargs("tiny-llama", dtype="float16")


def test_prompt_logits_agree_with_greedy_and_across_chunk_sizes(llm: LLM) -> None:
    engine = llm.llm_engine
    prompt = [(i * 13) % 500 + 2 for i in range(70)]
    whole = engine.prompt_logits(prompt, chunk_size=70)
    assert whole.shape == (70, 512) and whole.dtype == torch.float32
    for chunk in (1, 16, 33):  # later chunks read earlier tokens back from the paged cache
        torch.testing.assert_close(engine.prompt_logits(prompt, chunk), whole, rtol=1e-4, atol=1e-3)
    # the last row is what generation samples its first token from; each row predicts the next
    full = prompt + llm.generate([prompt], greedy(3, ignore_eos=True))[0].outputs[0].token_ids
    assert engine.prompt_logits(full)[69:72].argmax(-1).tolist() == full[70:73]
    assert engine.stats()["kv_blocks_used"] == 0
    with pytest.raises(RuntimeError, match="free KV blocks"):
        engine.prompt_logits([5] * 700)  # 44 blocks > the 40 this engine has


def test_chunking_off_below_the_context_warns_then_rejects_long_prompts(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level("WARNING", logger="engine.config"):
        llm = LLM(
            "tiny-llama", dtype="float32", enable_chunked_prefill=False, max_num_batched_tokens=64
        )
    assert "prompts over 64 tokens will be rejected" in caplog.text
    with pytest.raises(ValueError, match="more than max_num_batched_tokens=64"):
        llm.generate([[5] * 65], greedy(2))
    assert len(llm.generate([[5] * 64], greedy(2))[0].outputs[0].token_ids) == 2


def _step_outputs(engine: LLMEngine, prompt: str, params: SamplingParams) -> list[str]:
    """Every text the request's outputs showed, step by step (what a stream would send)."""
    engine.add_request("r", prompt, params)
    texts = []
    while engine.has_unfinished_requests():
        texts += [o.outputs[0].text for o in engine.step()]
    return texts


def test_no_output_shows_text_that_a_stop_string_later_cuts() -> None:
    engine = LLMEngine(EngineConfig.from_kwargs("tiny-smollm2", max_num_seqs=2, seed=0))
    prompt = "Once upon a time"
    free = _step_outputs(engine, prompt, greedy(40, ignore_eos=True))
    text = free[-1]
    # Stop strings that start in one token's text and end in a later one's: their first
    # characters were already in an output when they complete.
    bounds = sorted({len(t) for t in free if 2 <= len(t) <= len(text) - 6})
    assert len(bounds) >= 4, free
    for b in bounds[:: max(1, len(bounds) // 6)]:
        for n in (2, 5):
            stop = text[b - 1 : b - 1 + n]
            texts = _step_outputs(engine, prompt, greedy(40, ignore_eos=True, stop=[stop, "\0"]))
            final = texts[-1]
            assert final == text[: text.index(stop)]
            for shown in texts:
                assert final.startswith(shown), (stop, shown, final)
    # Without stop strings nothing is held back.
    assert _step_outputs(engine, prompt, greedy(40, ignore_eos=True)) == free


def test_a_rejected_prompt_leaves_nothing_queued(llm: LLM) -> None:
    engine = llm.llm_engine
    before = engine.stats()["prompt_tokens_total"]
    with pytest.raises(ValueError, match="prompt token ids"):
        llm.generate([[5, 6, 7], [8, 9], [10**9]], greedy(3))
    assert not engine.has_unfinished_requests() and not engine.requests
    outs = llm.generate([[11, 12]], greedy(3, ignore_eos=True))
    assert [o.prompt_token_ids for o in outs] == [[11, 12]]
    assert engine.stats()["prompt_tokens_total"] - before == 2  # nothing else was computed


def test_an_interrupted_generate_leaves_nothing_queued(
    llm: LLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = llm.llm_engine
    real_step, calls = engine.step, {"n": 0}

    def interrupted_step() -> list:
        calls["n"] += 1
        if calls["n"] == 2:
            raise KeyboardInterrupt
        return real_step()

    monkeypatch.setattr(engine, "step", interrupted_step)
    with pytest.raises(KeyboardInterrupt):
        llm.generate([[5, 6, 7], [8, 9]], greedy(6, ignore_eos=True))
    assert not engine.has_unfinished_requests() and engine.kv.num_used_blocks == 0


@pytest.mark.parametrize("batching", ["static", "continuous"])
def test_the_step_log_counts_waiting_as_stats_does(batching: str, tmp_path: Path) -> None:
    # A small token budget leaves some of a static batch's members not yet running.
    engine = LLMEngine(
        EngineConfig.from_kwargs(
            "tiny-llama", batching=batching, max_num_seqs=4, max_num_batched_tokens=24
        )
    )
    engine.log_steps(tmp_path / "steps.jsonl")
    for i in range(7):
        engine.add_request(f"r{i}", [5 + i] * 20, greedy(3, ignore_eos=True))
    waiting = []
    while engine.has_unfinished_requests():
        engine.step()
        waiting.append(engine.stats()["num_waiting"])
    engine.log_steps(None)
    logged = [json.loads(line)["waiting"] for line in (tmp_path / "steps.jsonl").open()]
    assert logged == waiting
    assert max(waiting) > 0
