"""logit_bias, min_tokens, presence/frequency/repetition penalties and min_p, as vLLM applies
them: against a hand computation on the logits, through the engine, and refused out of
vLLM's ranges (a 400 naming the field). A batch that sets none of them skips the work."""

import math
from typing import Any

import pytest
import torch

from engine import LLM, SamplingParams
from engine.core.request import Request
from engine.logits_processors import apply_processors
from engine.sampler import probabilities, sample
from engine.serving.protocol import APIError, parse_completion

EOS = 7


def req(output: list[int], prompt: list[int] | None = None, **params: Any) -> Request:
    r = Request("r", prompt or [0], SamplingParams(**params), eos_token_ids=(EOS,))
    r.token_ids += output
    return r


def test_each_processor_against_a_hand_computation() -> None:
    logits = torch.tensor([[1.0, -2.0, 3.0, 0.5, -1.0, 2.0, 0.0, 4.0]] * 6)
    reqs = [
        req([1]),  # nothing set: unchanged
        req([1], logit_bias={2: 5.0, 3: -100.0}),
        req([1, 1, 4], presence_penalty=0.5, frequency_penalty=0.25),
        req([5], prompt=[0, 1], repetition_penalty=2.0),
        req([1], min_tokens=3, stop_token_ids=[6]),  # 1 < 3: EOS and 6 masked
        req([1, 2, 3], min_tokens=3, stop_token_ids=[6]),  # reached: nothing masked
    ]
    out = apply_processors(logits, reqs)
    want = logits.clone()
    want[1, 2] += 5.0
    want[1, 3] -= 100.0
    want[2, 1] -= 0.5 + 2 * 0.25
    want[2, 4] -= 0.5 + 1 * 0.25
    want[3, 0] /= 2.0  # prompt token, positive: divided
    want[3, 1] *= 2.0  # prompt token, negative: multiplied
    want[3, 5] /= 2.0  # output token
    want[4, EOS] = want[4, 6] = -math.inf
    torch.testing.assert_close(out, want)
    assert torch.equal(logits[0], out[0])  # the input is not modified


def test_min_p_drops_tokens_below_its_share_of_the_top_probability() -> None:
    logits = torch.tensor([[math.log(0.5), math.log(0.3), math.log(0.15), math.log(0.05)]])
    probs = probabilities(logits, [SamplingParams(min_p=0.2)])
    # 0.2 x 0.5 = 0.1: the 0.05 token goes, the rest renormalize
    torch.testing.assert_close(probs, torch.tensor([[0.5, 0.3, 0.15, 0.0]]) / 0.95)
    assert torch.equal(probabilities(logits, [SamplingParams(min_p=0.0)]), logits.softmax(-1))


def test_a_batch_without_them_skips_the_work_and_samples_as_before(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def fail(*args: object) -> None:
        raise AssertionError("processors ran for a batch that sets none")

    monkeypatch.setattr("engine.sampler.apply_processors", fail)
    logits = torch.randn(4, 32)
    reqs = [req([1], temperature=0.0) for _ in range(4)]
    assert sample(logits, reqs, torch.Generator()) == logits.argmax(-1).tolist()


@pytest.fixture(scope="module")
def llm() -> LLM:
    return LLM("tiny-llama", dtype="float32", max_num_seqs=4, num_kv_blocks=40)


def greedy(llm: LLM, **params: Any) -> list[int]:
    p = SamplingParams(**{"max_tokens": 8, "temperature": 0.0, "ignore_eos": True, **params})
    return llm.generate([[5, 6, 7, 8]], p)[0].outputs[0].token_ids


def test_bias_against_the_reply_changes_the_reply(llm: LLM) -> None:
    reply = greedy(llm)
    biased = greedy(llm, logit_bias={t: -100.0 for t in reply})
    assert not set(biased) & set(reply)
    assert greedy(llm, logit_bias={reply[0]: 0.0}) == reply
    pushed = 3 if reply[0] != 3 else 4
    assert greedy(llm, logit_bias={pushed: 100.0})[0] == pushed


def test_min_tokens_holds_back_stop_tokens_until_reached(llm: LLM) -> None:
    first = greedy(llm)[0]
    p = SamplingParams(max_tokens=8, temperature=0.0, stop_token_ids=[first])
    assert llm.generate([[5, 6, 7, 8]], p)[0].outputs[0].token_ids == [first]
    p = SamplingParams(max_tokens=8, temperature=0.0, stop_token_ids=[first], min_tokens=5)
    out = llm.generate([[5, 6, 7, 8]], p)[0].outputs[0]
    assert len(out.token_ids) >= 5 and first not in out.token_ids[:5]


def test_penalties_stop_a_greedy_reply_from_repeating(llm: LLM) -> None:
    reply = greedy(llm, max_tokens=24)
    assert len(set(reply)) < len(reply)  # the random model repeats itself
    assert greedy(llm, max_tokens=24, repetition_penalty=1.0, presence_penalty=0.0) == reply
    for params in ({"frequency_penalty": 2.0}, {"presence_penalty": 2.0}):
        penalized = greedy(llm, max_tokens=24, **params)
        assert len(set(penalized)) > len(set(reply)), params
    # The repetition penalty covers the prompt too: no prompt token comes back.
    assert not {5, 6, 7, 8} & set(greedy(llm, max_tokens=24, repetition_penalty=3.0))


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("presence_penalty", 2.5),
        ("frequency_penalty", -3),
        ("repetition_penalty", 0),
        ("min_p", 1.5),
        ("min_tokens", -1),
        ("min_tokens", 17),  # past the default max_tokens of 16
        ("logit_bias", {"x": 1}),
        ("logit_bias", {"5": "high"}),
        ("logit_bias", [1, 2]),
        ("suffix", "tail"),  # what would change the reply is refused, never ignored
        ("response_format", {"type": "json_object"}),
        ("response_format", "text"),
        ("tools", [{"type": "function", "function": {"name": "f"}}]),
    ],
)
def test_out_of_range_values_get_a_400_naming_the_field(field: str, value: Any) -> None:
    with pytest.raises(APIError) as e:
        parse_completion({"prompt": "hi", field: value})
    assert (e.value.status, e.value.param) == (400, field)


def test_values_reach_the_sampling_params_and_bias_is_clamped() -> None:
    body = {
        "prompt": "hi",
        "max_tokens": 20,
        "logit_bias": {"5": -1000, "6": 2.5},
        "min_tokens": 4,
        "presence_penalty": 1.0,
        "frequency_penalty": -0.5,
        "repetition_penalty": 1.3,
        "min_p": 0.1,
    }
    p = parse_completion(body).params
    assert p.logit_bias == {5: -100.0, 6: 2.5}
    got = (p.min_tokens, p.presence_penalty, p.frequency_penalty, p.repetition_penalty, p.min_p)
    assert got == (4, 1.0, -0.5, 1.3, 0.1) and p.processes_logits
    assert not parse_completion({"prompt": "hi"}).params.processes_logits


def test_sampling_params_refuse_vllms_out_of_range_values(llm: LLM) -> None:
    for kw in (
        {"presence_penalty": 3.0},
        {"frequency_penalty": -2.1},
        {"repetition_penalty": 0.0},
        {"repetition_penalty": math.inf},
        {"min_p": -0.1},
        {"min_tokens": 20, "max_tokens": 10},
        {"logit_bias": {-1: 1.0}},
        {"logit_bias": {1: math.nan}},
    ):
        with pytest.raises(ValueError):
            SamplingParams(**kw)  # type: ignore[arg-type]
    vocab = llm.llm_engine.model_config.vocab_size
    with pytest.raises(ValueError, match="logit_bias"):
        llm.generate([[5, 6]], SamplingParams(logit_bias={vocab: 1.0}))


def test_speculative_decoding_leaves_penalized_requests_to_the_plain_sampler() -> None:
    """The verifier knows none of the processors: such requests get no drafts, and their
    tokens equal the engine's without speculation."""
    # A reply of 5s that n-gram lookup would gladly draft, and an unbiased verifier reject.
    params = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True, min_tokens=4,
                            logit_bias={5: 100.0})  # fmt: skip
    plain = LLM("tiny-llama", dtype="float32", max_num_seqs=2)
    spec = LLM("tiny-llama", dtype="float32", max_num_seqs=2,
               speculative_config={"method": "ngram", "num_speculative_tokens": 3})  # fmt: skip
    prompt = [[5, 6, 7, 5, 6, 7, 5, 6, 7]]
    want = plain.generate(prompt, params)[0].outputs[0].token_ids
    assert want == [5] * 16
    assert spec.generate(prompt, params)[0].outputs[0].token_ids == want
    assert spec.llm_engine.stats()["spec_decode_num_draft_tokens"] == 0


def test_fields_that_change_nothing_pass() -> None:
    for extra in (
        {"suffix": ""},
        {"response_format": {"type": "text"}},
        {"tools": [{"type": "function"}], "tool_choice": "none"},
        {"user": "u"},
    ):
        assert parse_completion({"prompt": "hi", **extra}).params is not None
