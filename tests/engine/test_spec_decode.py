"""Speculative decoding: proposals verified in the step's forward pass never change greedy
output (any batch mix), sampled output keeps the target's distribution (rejection sampling,
tested statistically), rejected drafts' KV slots are rolled back, and the counters add up."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from engine import LLM, SamplingParams
from engine.config import EngineConfig, SpeculativeConfig
from engine.sampler import probabilities
from engine.spec_decode.ngram import find_ngram_proposal
from engine.spec_decode.rejection import rejection_sample

NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3}
DRAFT = {"method": "draft_layers", "num_speculative_tokens": 3, "num_draft_layers": 1}
# Tokens that repeat (n-gram lookup finds them) and tokens that do not.
PROMPTS = [
    [(11 * k) % 400 + 5 for k in range(70)],
    [7, 8, 9, 10, 11] * 9,
    [3, 4] + [(5 * k * k) % 500 for k in range(30)],
    [42],
    list(range(100, 140)) + list(range(100, 120)),
]


def chi2_pvalue(observed: np.ndarray, expected_probs: np.ndarray) -> float:
    """Pearson's goodness-of-fit p-value, with the bins expected to hold under 5 samples
    pooled into one (torch's regularized upper incomplete gamma is the chi-square tail)."""
    n = observed.sum()
    expected = expected_probs * n
    small = expected < 5
    obs = np.append(observed[~small], observed[small].sum())
    exp = np.append(expected[~small], expected[small].sum())
    keep = exp > 0
    obs, exp = obs[keep], exp[keep]
    stat = float(((obs - exp) ** 2 / exp).sum())
    df = len(obs) - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2), torch.tensor(stat / 2)))


def generate(model: str, prompts: list, params: SamplingParams, **args: Any) -> tuple[list, dict]:
    llm = LLM(model, **args)
    outs = llm.generate(prompts, params)
    return [[c.token_ids for c in o.outputs] for o in outs], llm.llm_engine.stats()


# ---- proposals -------------------------------------------------------------------------


def test_ngram_proposes_what_followed_the_latest_longest_match() -> None:
    tokens = np.array([1, 2, 3, 4, 5, 9, 2, 3, 4, 6, 7, 2, 3, 4])
    # "2 3 4" occurs at 1 and 6; the latest (6) was followed by 6 7 2 ...
    assert find_ngram_proposal(tokens, 2, 3, k=3) == [6, 7, 2]
    assert find_ngram_proposal(tokens, 2, 3, k=10) == [6, 7, 2, 3, 4]  # up to the end
    # The longest n wins: "9 3 4" never occurred, "3 4" did (the latest at 7).
    assert find_ngram_proposal(np.array([3, 4, 8, 1, 3, 4, 5, 9, 3, 4]), 1, 3, k=2) == [5, 9]
    assert find_ngram_proposal(np.array([1, 2, 3, 4]), 2, 4, k=3) == []  # nothing repeats
    assert find_ngram_proposal(np.array([5]), 1, 4, k=3) == []


def test_speculative_config_is_checked() -> None:
    with pytest.raises(ValueError, match="unknown speculative_config keys"):
        SpeculativeConfig.parse({"method": "ngram", "k": 3})
    with pytest.raises(ValueError, match="method must be one of"):
        SpeculativeConfig.parse('{"method": "eagle"}')
    with pytest.raises(ValueError, match="not valid JSON"):
        SpeculativeConfig.parse("{method: ngram}")
    with pytest.raises(ValueError, match="num_speculative_tokens"):
        SpeculativeConfig.parse({"num_speculative_tokens": 0})
    with pytest.raises(ValueError, match="prompt_lookup_min"):
        SpeculativeConfig.parse({"prompt_lookup_min": 3, "prompt_lookup_max": 2})
    with pytest.raises(ValueError, match="fewer than the model's 2 layers"):
        LLM("tiny-llama", speculative_config={"method": "draft_layers", "num_draft_layers": 2})
    cfg = EngineConfig.from_kwargs("tiny-llama", speculative_config='{"method": "draft_layers"}')
    assert cfg.speculative_config == SpeculativeConfig(method="draft_layers")
    llm = LLM("tiny-llama", speculative_config={"method": "draft_layers"})
    assert llm.llm_engine.config.speculative_config.num_draft_layers == 1  # resolved: half


# ---- greedy: the same tokens -------------------------------------------------------------

MIXES: dict[str, dict[str, Any]] = {
    "default": {},
    "budget-16": dict(max_num_batched_tokens=16),  # drafts compete with prefill chunks
    "preemption": dict(num_kv_blocks=14, max_num_seqs=8),
    "static": dict(batching="static", max_num_seqs=2),
    "no-prefix-caching": dict(enable_prefix_caching=False),
    "max-len-reservation": dict(kv_reservation="max_len", max_model_len=128),
}


@pytest.mark.parametrize("spec", [NGRAM, DRAFT], ids=["ngram", "draft_layers"])
@pytest.mark.parametrize("mix", MIXES)
def test_greedy_output_is_unchanged(spec: dict, mix: str) -> None:
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    want, _ = generate("tiny-llama", PROMPTS, params, **MIXES[mix])
    got, stats = generate("tiny-llama", PROMPTS, params, speculative_config=spec, **MIXES[mix])
    assert got == want
    assert stats["kv_blocks_used"] == 0  # every block returned, rolled-back ones included
    assert stats["spec_decode_num_drafts"] > 0
    assert 0 < stats["spec_decode_num_accepted_tokens"] <= stats["spec_decode_num_draft_tokens"]
    per_pos = stats["spec_decode_num_accepted_tokens_per_pos"]
    assert sum(per_pos) == stats["spec_decode_num_accepted_tokens"]
    assert per_pos == sorted(per_pos, reverse=True)  # position i needs all before it accepted
    assert stats["generation_tokens_total"] == 24 * len(PROMPTS)
    if mix == "preemption":
        assert stats["num_preemptions"] > 0


def test_greedy_n_stops_and_max_tokens_with_speculation() -> None:
    """n > 1 siblings, a stop token met among accepted drafts (the rest dropped) and
    max_tokens never exceeded by a verified draft."""
    cases = [
        SamplingParams(n=3, max_tokens=20, temperature=0.0),
        SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True),
    ]
    for params in cases:
        want, _ = generate("tiny-llama", PROMPTS, params)
        got, _ = generate("tiny-llama", PROMPTS, params, speculative_config=NGRAM)
        assert got == want
    plain, _ = generate("tiny-llama", PROMPTS[1:2], SamplingParams(max_tokens=30, temperature=0))
    stop = plain[0][0][12]  # a token the greedy output reaches: it must end there
    params = SamplingParams(max_tokens=30, temperature=0.0, stop_token_ids=[stop])
    want, _ = generate("tiny-llama", PROMPTS[1:2], params)
    got, _ = generate("tiny-llama", PROMPTS[1:2], params, speculative_config=NGRAM)
    assert got == want and got[0][0][-1] == stop


def test_rejected_drafts_give_back_whole_blocks() -> None:
    """40 drafts a step take 3 more blocks; after verification the table covers the
    computed tokens and the next one only."""
    llm = LLM("tiny-llama", speculative_config={**DRAFT, "num_speculative_tokens": 40})
    engine = llm.llm_engine
    engine.add_request("r", PROMPTS[2], SamplingParams(max_tokens=60, temperature=0.0))
    steps_with_drafts = 0
    while engine.has_unfinished_requests():
        before = engine.speculator.drafts
        engine.step()
        req = engine.requests.get("r")
        if req is None:
            break
        table = engine.kv.block_tables["r"]
        assert len(table) <= engine.kv.blocks_for(req.num_computed_tokens + 1)
        steps_with_drafts += engine.speculator.drafts > before
    assert steps_with_drafts > 0
    assert engine.kv.peak_blocks_used >= engine.kv.blocks_for(32 + 41)
    assert engine.stats()["kv_blocks_used"] == 0


@pytest.mark.slow
@pytest.mark.parametrize("spec", [NGRAM, {**DRAFT, "num_draft_layers": 24}], ids=["ngram", "draft"])
def test_smollm2_greedy_output_is_unchanged(spec: dict) -> None:
    from tests.engine.test_modes import PROMPTS as TEXTS

    texts = [*TEXTS, "Repeat exactly: the cat sat on the mat. The cat sat on the mat."]
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    want, _ = generate("smollm2-135m", texts, params, dtype="float32")
    got, stats = generate("smollm2-135m", texts, params, dtype="float32", speculative_config=spec)
    assert got == want
    assert stats["spec_decode_num_accepted_tokens"] > 0


# ---- sampling: the target's distribution ---------------------------------------------------


@pytest.mark.parametrize("one_hot", [True, False], ids=["one-hot-q", "sampled-q"])
def test_rejection_sampling_keeps_the_target_distribution(one_hot: bool) -> None:
    """Each emitted token follows p whatever q proposed: the first token (accepted draft or
    residual draw) and, where the first draft was accepted, the second."""
    gen = torch.Generator().manual_seed(0)
    vocab, s, trials = 6, 2, 30_000
    target = torch.softmax(torch.randn(s + 1, vocab, generator=gen) * 1.5, dim=-1)
    q = torch.softmax(torch.randn(s, vocab, generator=gen) * 1.5, dim=-1)
    first = np.zeros(vocab)
    second = np.zeros(vocab)
    proposed = np.zeros(vocab)
    for _ in range(trials):
        drafts = [int(torch.multinomial(q[i], 1, generator=gen)) for i in range(s)]
        if one_hot:
            drafts[0] = 2  # a fixed guess: q is one-hot at it
        out = rejection_sample(target, drafts, gen, None if one_hot else q)
        assert 1 <= len(out) <= s + 1 and out[:-1] == drafts[: len(out) - 1]
        first[out[0]] += 1
        proposed[drafts[0]] += 1
        if len(out) > 1:
            second[out[1]] += 1
    assert chi2_pvalue(first, target[0].numpy()) > 1e-3
    assert chi2_pvalue(second, target[1].numpy()) > 1e-3
    if not one_hot:  # the test can fail: the drafts themselves do not follow p
        assert chi2_pvalue(proposed, target[0].numpy()) < 1e-6


def test_sampled_output_keeps_the_models_distribution_end_to_end() -> None:
    """The engine's second sampled token (the first one verified with drafts: proposals start
    after the first output) follows the exact marginal sum_t1 p(t1) p(t2 | t1) of the tiny
    model, computed from its logits, with temperature and top-k applied."""
    prompt = [5, 6, 7, 8, 9, 10]
    params = SamplingParams(max_tokens=3, temperature=0.7, top_k=40, ignore_eos=True)
    llm = LLM("tiny-llama", speculative_config={**DRAFT, "num_speculative_tokens": 2})
    engine = llm.llm_engine
    outs = llm.generate([prompt] * 1500, params)
    stats = engine.stats()
    assert 0 < stats["spec_decode_num_accepted_tokens"] < stats["spec_decode_num_draft_tokens"]
    vocab = engine.model_config.vocab_size
    p1 = probabilities(engine.prompt_logits(prompt)[-1:], [params])[0]
    marginal = torch.zeros(vocab)
    for t1 in torch.nonzero(p1 > 0).flatten().tolist():
        logits = engine.prompt_logits([*prompt, t1])[-1:]
        marginal += p1[t1] * probabilities(logits, [params])[0]
    second = np.bincount([o.outputs[0].token_ids[1] for o in outs], minlength=vocab)
    third = np.bincount([o.outputs[0].token_ids[2] for o in outs], minlength=vocab)
    assert chi2_pvalue(second, marginal.numpy()) > 1e-3
    # The test can fail: the third token does not follow the second's marginal.
    assert chi2_pvalue(third, marginal.numpy()) < 1e-6
