"""Prefix caching changes what is computed, never what comes out: greedy outputs with the cache
on equal those with it off in every batching and prefill mode, on SmolLM2 and on a tiny random
model, while later requests with a shared prefix skip its prefill."""

from __future__ import annotations

from typing import Any

import pytest

from engine import LLM, SamplingParams

SYSTEM = (
    "<|im_start|>system\nYou are a careful assistant. Answer in one short sentence, and "
    "never use lists. Facts: the sky is blue, grass is green, the sea is salty.<|im_end|>\n"
)
QUESTIONS = [
    "What colour is the sky?",
    "Why is the sea salty?",
    "Name a green plant.",
    "What is 2+2?",
    "Say hello.",
    "Describe grass in three words.",
]
PROMPTS = [f"{SYSTEM}<|im_start|>user\n{q}<|im_end|>\n<|im_start|>assistant\n" for q in QUESTIONS]
PARAMS = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)

MODES: dict[str, dict[str, Any]] = {
    "chunked-16": dict(max_num_batched_tokens=16),
    "chunked-512": dict(max_num_batched_tokens=512),
    "no-chunked-prefill": dict(enable_chunked_prefill=False, max_num_batched_tokens=512),
    "static": dict(batching="static", max_num_seqs=3),
    "preemption": dict(num_kv_blocks=24, max_num_seqs=6),
}


def two_waves(model: str, **engine_args: Any) -> tuple[list[list[int]], LLM, list[Any]]:
    """The prompts once (the first fills the cache), then again (they hit it)."""
    llm = LLM(model, dtype="float32", **engine_args)
    first = llm.generate(PROMPTS[:1] + PROMPTS, PARAMS)
    second = llm.generate(PROMPTS, PARAMS)
    return [o.outputs[0].token_ids for o in first + second], llm, second


@pytest.mark.slow
@pytest.mark.parametrize("mode", MODES)
def test_smollm2_greedy_output_is_the_same_with_the_cache_on_and_off(mode: str) -> None:
    off, _, _ = two_waves("smollm2-135m", enable_prefix_caching=False, **MODES[mode])
    on, llm, second = two_waves("smollm2-135m", **MODES[mode])
    assert on == off
    stats = llm.llm_engine.stats()
    assert stats["kv_blocks_used"] == 0 and stats["prefix_cache_hits"] > 0
    assert all(o.num_cached_tokens >= 16 for o in second)  # the system prompt, at least
    if mode == "preemption":
        assert stats["num_preemptions"] > 0


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("model", ["tiny-llama", "tiny-llama-untied"])
def test_tiny_model_greedy_output_is_the_same_with_the_cache_on_and_off(
    model: str, mode: str
) -> None:
    ids = [[(7 * k + 3) % 500 + 1 for k in range(40)] + [q] * (5 + q) for q in range(6)]
    params = SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True)

    def run(**args: Any) -> tuple[list[list[int]], dict[str, Any]]:
        llm = LLM(model, **MODES[mode], **args)
        outs = llm.generate(ids, params) + llm.generate(ids, params)
        return [o.outputs[0].token_ids for o in outs], llm.llm_engine.stats()

    off, off_stats = run(enable_prefix_caching=False)
    on, on_stats = run()
    assert on == off
    assert off_stats["prefix_cache_hits"] == 0 and on_stats["prefix_cache_hits"] > 0
    assert on_stats["kv_blocks_used"] == 0


def test_the_last_prompt_token_is_always_computed() -> None:
    """A prompt seen before in full still computes its last block's worth: its logits are
    needed; a prompt that extends a cached one reuses all of the cached full blocks."""
    llm = LLM("tiny-llama")
    prompt = list(range(1, 49))  # 3 full blocks of 16
    params = SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True)
    first = llm.generate([prompt], params)[0]
    again = llm.generate([prompt], params)[0]
    longer = llm.generate([[*prompt, 60, 61]], params)[0]
    assert first.num_cached_tokens == 0
    assert again.num_cached_tokens == 32  # not 48: the last token is computed again
    assert again.outputs[0].token_ids == first.outputs[0].token_ids
    assert longer.num_cached_tokens == 48
    stats = llm.llm_engine.stats()
    assert stats["prefix_cache_queries"] == 48 + 48 + 50
    assert stats["prefix_cache_hits"] == 32 + 48
    assert stats["prefix_cache_hit_rate"] == pytest.approx(80 / 146)


def test_a_reset_forgets_cached_blocks_and_off_means_off() -> None:
    llm = LLM("tiny-llama")
    prompt = list(range(1, 41))
    params = SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True)
    llm.generate([prompt], params)
    assert llm.llm_engine.reset_prefix_cache() > 0
    assert llm.generate([prompt], params)[0].num_cached_tokens == 0
    off = LLM("tiny-llama", enable_prefix_caching=False)
    off.generate([prompt], params)
    assert off.generate([prompt], params)[0].num_cached_tokens == 0
    assert off.llm_engine.stats()["prefix_cache_queries"] == 0
