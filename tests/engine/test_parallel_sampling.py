"""Parallel sampling (n > 1): one prompt, n completions as children that share the prompt's
full KV blocks (computed once, by the first child) and recompute only its partial last block,
so no child writes into a block another reads."""

from __future__ import annotations

import asyncio

import pytest

from engine import LLM, SamplingParams
from engine.serving.async_engine import AsyncLLMEngine

PROMPT = [(11 * k) % 400 + 5 for k in range(70)]  # 4 full blocks of 16 and 6 tokens more


def test_greedy_n_gives_n_equal_completions_equal_to_n_1() -> None:
    llm = LLM("tiny-llama")
    one = llm.generate([PROMPT], SamplingParams(max_tokens=8, temperature=0.0))[0]
    four = llm.generate([PROMPT], SamplingParams(n=4, max_tokens=8, temperature=0.0))[0]
    assert [c.index for c in four.outputs] == [0, 1, 2, 3]
    assert all(c.token_ids == one.outputs[0].token_ids for c in four.outputs)
    assert all(c.finish_reason == "length" for c in four.outputs) and four.finished
    assert llm.llm_engine.stats()["kv_blocks_used"] == 0


def test_seeded_children_are_their_own_streams_and_reproducible() -> None:
    """Child i samples as a request of seed + i would (vLLM's rule)."""
    llm = LLM("tiny-llama")
    params = SamplingParams(n=3, max_tokens=12, temperature=1.0, seed=7)
    outs = llm.generate([PROMPT], params)[0].outputs
    assert len({tuple(c.token_ids) for c in outs}) == 3
    assert [c.token_ids for c in llm.generate([PROMPT], params)[0].outputs] == [
        c.token_ids for c in outs
    ]
    for i, c in enumerate(outs):
        alone = SamplingParams(max_tokens=12, temperature=1.0, seed=7 + i)
        assert llm.generate([PROMPT], alone)[0].outputs[0].token_ids == c.token_ids


def test_children_share_the_prompts_full_blocks() -> None:
    """n = 4 of a 70-token prompt: 4 shared full blocks (computed once) plus each child's own
    partial block and output, against 4 independent requests with no cache."""
    params = SamplingParams(n=4, max_tokens=10, temperature=0.0, ignore_eos=True)
    shared = LLM("tiny-llama", max_num_seqs=8)
    shared.generate([PROMPT], params)
    s = shared.llm_engine.stats()
    alone = LLM("tiny-llama", max_num_seqs=8, enable_prefix_caching=False)
    alone.generate([PROMPT], params)
    a = alone.llm_engine.stats()
    assert a["kv_peak_blocks_used"] == 4 * 5  # 80 tokens: 5 blocks each
    assert s["kv_peak_blocks_used"] == 4 + 4 * 1  # 4 shared + each child's 1 own block
    assert s["kv_peak_blocks_shared"] == 3 * 4  # 3 children each reuse the 4 blocks
    assert s["prompt_tokens_computed"] == 70 + 3 * (70 - 64)
    assert a["prompt_tokens_computed"] == 4 * 70


@pytest.mark.parametrize(
    "args",
    [dict(batching="static", max_num_seqs=4), dict(enable_prefix_caching=False), dict()],
)
def test_n_is_correct_in_every_mode(args: dict) -> None:
    llm = LLM("tiny-llama", **args)
    one = llm.generate([PROMPT, PROMPT[:20]], SamplingParams(max_tokens=6, temperature=0.0))
    many = llm.generate([PROMPT, PROMPT[:20]], SamplingParams(n=3, max_tokens=6, temperature=0.0))
    for o, m in zip(one, many, strict=True):
        assert [c.token_ids for c in m.outputs] == [o.outputs[0].token_ids] * 3


def test_streams_carry_each_completions_index_and_an_abort_ends_them_all() -> None:
    async def go() -> tuple[list[tuple[int, int]], bool, int]:
        engine = AsyncLLMEngine(LLM("tiny-llama").llm_engine)
        await engine.start()
        try:
            seen = []
            params = SamplingParams(n=3, max_tokens=4, temperature=0.0, ignore_eos=True)
            async for out in engine.generate("r", PROMPT, params):
                c = out.outputs[0]
                seen.append((c.index, len(c.token_ids)))
                last_finished = out.finished
            stream = engine.generate("s", PROMPT, SamplingParams(n=3, max_tokens=50))
            await stream.__anext__()
            await stream.aclose()  # aborts all three
            for _ in range(100):
                await asyncio.sleep(0.01)
                if not engine.engine.has_unfinished_requests():
                    break
            return seen, last_finished, engine.engine.stats()["kv_blocks_used"]
        finally:
            await engine.stop()

    seen, finished, used = asyncio.run(go())
    assert {i for i, _ in seen} == {0, 1, 2} and finished
    assert sorted(n for i, n in seen if n == 4) == [4, 4, 4]  # each completion's last output
    assert used == 0


def test_n_out_of_range_is_refused() -> None:
    with pytest.raises(ValueError, match="n must be in"):
        SamplingParams(n=0)
