"""Batching and prefill settings change when work happens, never what is computed: greedy
outputs of SmolLM2 are identical in every mode (float32, so that a different batch shape
cannot flip a near-tie through rounding)."""

from typing import Any

import pytest

from engine import LLM, SamplingParams

pytestmark = pytest.mark.slow

PROMPTS = [
    "The capital of France is",
    "def quicksort(xs):",
    "A short story about a robot who learns to paint:",
    "Hi",
    "List three colours:",
    " ".join(f"Item {i}: a {'red' if i % 3 else 'blue'} box." for i in range(25)),  # ~200 tokens
    "The three laws of thermodynamics are",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
]
PARAMS = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)

MODES: dict[str, dict[str, Any]] = {
    "chunked-16": dict(max_num_batched_tokens=16),
    "chunked-64": dict(max_num_batched_tokens=64),
    "chunked-512": dict(max_num_batched_tokens=512),
    "long-prefill-threshold-24": dict(max_num_batched_tokens=256, long_prefill_token_threshold=24),
    "no-chunked-prefill": dict(enable_chunked_prefill=False, max_num_batched_tokens=512),
    "static": dict(batching="static", max_num_seqs=3),
    "static-no-chunked": dict(
        batching="static", enable_chunked_prefill=False, max_num_batched_tokens=512
    ),
    "one-at-a-time": dict(max_num_seqs=1),
    "preemption": dict(num_kv_blocks=20, max_num_seqs=16),
}


def run(**engine_args: Any) -> tuple[list[list[int]], dict[str, Any]]:
    llm = LLM("smollm2-135m", dtype="float32", **engine_args)
    outs = llm.generate(PROMPTS, PARAMS)
    return [o.outputs[0].token_ids for o in outs], llm.llm_engine.stats()


@pytest.fixture(scope="module")
def baseline() -> list[list[int]]:
    tokens, stats = run(max_num_seqs=16)  # all 8 concurrently, default chunked prefill
    assert stats["kv_blocks_used"] == 0
    return tokens


@pytest.mark.parametrize("mode", MODES)
def test_greedy_output_is_the_same_in_every_mode(mode: str, baseline: list[list[int]]) -> None:
    tokens, stats = run(**MODES[mode])
    assert tokens == baseline
    assert stats["kv_blocks_used"] == 0  # every block returned
    if mode == "preemption":
        assert stats["num_preemptions"] > 0
