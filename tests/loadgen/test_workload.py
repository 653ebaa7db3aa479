"""Workloads: length distributions, prompts of exactly the asked token count, shared prefixes,
trace replays (Mooncake hash ids as shared 512-token blocks) and ShareGPT conversations."""

from __future__ import annotations

import itertools
import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from engine.model.loader import load_tokenizer
from loadgen.traces import read_trace
from loadgen.workload import (
    LengthDist,
    PromptBuilder,
    RequestSpec,
    WorkloadConfig,
    from_trace,
    read_sharegpt,
    sharegpt,
    synthetic,
)

DATA = Path(__file__).parents[1] / "data"
SHAREGPT = DATA / "sharegpt_sample.json"
SHAREGPT_SKIPPED = {"sg-003", "sg-004", "sg-006"}  # one turn; a 2-token reply; a 1-token prompt


@pytest.fixture(scope="module")
def tk() -> Any:
    return load_tokenizer("smollm2-135m")


@pytest.fixture(scope="module")
def builder(tk: Any) -> PromptBuilder:
    return PromptBuilder(tk)


def encode(tk: Any, text: str) -> list[int]:
    return tk.encode(text, add_special_tokens=False)


def take(stream: Any, n: int) -> list[RequestSpec]:
    return list(itertools.islice(stream, n))


# ---- length distributions ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "kind", "a", "b"),
    [
        ("128", "fixed", 128, 0),
        (128, "fixed", 128, 0),
        (" 7 ", "fixed", 7, 0),
        ("uniform:10:20", "uniform", 10, 20),
        ("uniform:5:5", "uniform", 5, 5),
        ("normal:100:10", "normal", 100, 10),
        ("lognormal:200:0.5", "lognormal", 200, 0.5),
    ],
)
def test_length_specs_parse(text: str | int, kind: str, a: float, b: float) -> None:
    assert LengthDist.parse(text) == LengthDist(kind, a, b)


@pytest.mark.parametrize(
    "text",
    [
        "0",
        "-3",
        "abc",
        "12.5",
        "uniform:20:10",
        "uniform:0:10",
        "uniform:1",
        "uniform:1:2:3",
        "gauss:1:2",
        "normal:-5:1",
        "normal:100:-1",
        "lognormal:0.5:1",
        "lognormal:100:x",
        "",
    ],
)
def test_bad_length_specs_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match="length"):
        LengthDist.parse(text)


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("uniform:200:100", "lo 200 > hi 100"),  # once "lengths are >= 1 token"
        ("uniform:0:10", "lo must be >= 1 token"),
        ("0", "a length is >= 1 token"),
        ("normal:100:-1", "std must be >= 0"),
        ("lognormal:0.5:1", "the mean must be >= 1 token"),
        ("lognormal:100:-2", "sigma must be >= 0"),
    ],
)
def test_a_bad_length_spec_gets_the_right_reason(text: str, why: str) -> None:
    with pytest.raises(ValueError, match=f"^length '{text}': {why}$"):
        LengthDist.parse(text)


@pytest.mark.parametrize("text", ["1", "300", "uniform:1:3", "normal:3:10", "lognormal:2:1.5"])
def test_samples_are_ints_of_at_least_one(text: str) -> None:
    rng = np.random.default_rng(0)
    samples = [LengthDist.parse(text).sample(rng) for _ in range(3000)]
    assert all(type(x) is int and x >= 1 for x in samples)


def test_fixed_length_is_always_itself() -> None:
    rng = np.random.default_rng(0)
    assert {LengthDist.parse("300").sample(rng) for _ in range(100)} == {300}


@pytest.mark.parametrize(("lo", "hi"), [(10, 20), (1, 3), (7, 7)])
def test_uniform_covers_lo_to_hi_inclusive(lo: int, hi: int) -> None:
    rng = np.random.default_rng(1)
    dist = LengthDist.parse(f"uniform:{lo}:{hi}")
    assert {dist.sample(rng) for _ in range(2000)} == set(range(lo, hi + 1))


def test_normal_has_the_given_mean_and_std() -> None:
    rng = np.random.default_rng(2)
    x = np.array([LengthDist.parse("normal:100:10").sample(rng) for _ in range(20000)])
    assert x.mean() == pytest.approx(100, rel=0.01)
    assert x.std() == pytest.approx(10, rel=0.05)


@pytest.mark.parametrize(("mean", "sigma"), [(200, 0.5), (200, 1.0), (50, 0.8)])
def test_lognormal_mean_is_the_mean_of_the_lengths(mean: int, sigma: float) -> None:
    """Not the mean of the underlying normal: that would give exp(sigma^2 / 2) times more."""
    rng = np.random.default_rng(3)
    dist = LengthDist.parse(f"lognormal:{mean}:{sigma}")
    x = np.array([dist.sample(rng) for _ in range(20000)])
    assert x.mean() == pytest.approx(mean, rel=0.05)
    assert np.std(np.log(x)) == pytest.approx(sigma, rel=0.05)


@pytest.mark.parametrize("text", ["uniform:1:inf", "lognormal:inf:1", "normal:inf:1"])
def test_non_finite_length_specs_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match="length"):
        LengthDist.parse(text)


def test_uniform_bounds_are_whole_tokens() -> None:
    with pytest.raises(ValueError, match="uniform:lo:hi"):
        LengthDist.parse("uniform:1.5:3.5")


# ---- synthetic prompts ------------------------------------------------------------------------


def test_prompts_have_exactly_the_asked_token_count(tk: Any, builder: PromptBuilder) -> None:
    specs = take(synthetic(WorkloadConfig(input_len="uniform:1:600", seed=0), builder), 200)
    lengths = [spec.input_len for spec in specs]
    assert min(lengths) >= 1 and max(lengths) <= 600
    assert len(set(lengths)) > 100
    word_ids = set(builder.word_ids.tolist())
    for spec in specs:
        ids = encode(tk, spec.prompt)
        assert len(ids) == spec.input_len
        assert set(ids) <= word_ids


@pytest.mark.parametrize(
    ("output_len", "values"),
    [("77", {77}), ("uniform:5:9", {5, 6, 7, 8, 9}), ("uniform:1:2", {1, 2})],
)
def test_output_lengths_follow_their_distribution(
    builder: PromptBuilder, output_len: str, values: set[int]
) -> None:
    cfg = WorkloadConfig(input_len="8", output_len=output_len, seed=4)
    specs = take(synthetic(cfg, builder), 200)
    assert {spec.output_len for spec in specs} == values
    assert {spec.input_len for spec in specs} == {8}


def test_output_length_mean_follows_a_normal(builder: PromptBuilder) -> None:
    cfg = WorkloadConfig(input_len="1", output_len="normal:300:30", seed=5)
    out = np.array([spec.output_len for spec in take(synthetic(cfg, builder), 2000)])
    assert out.mean() == pytest.approx(300, rel=0.01)
    assert out.std() == pytest.approx(30, rel=0.1)


def test_same_seed_gives_the_same_prompts_and_another_seed_others(builder: PromptBuilder) -> None:
    def run(seed: int) -> list[RequestSpec]:
        cfg = WorkloadConfig(input_len="uniform:1:100", output_len="uniform:1:100", seed=seed)
        return take(synthetic(cfg, builder), 50)

    first, again, other = run(0), run(0), run(1)
    assert first == again
    assert all(a.prompt != b.prompt for a, b in zip(first, other, strict=True))


def test_shared_prefix_groups(tk: Any, builder: PromptBuilder) -> None:
    cfg = WorkloadConfig(
        input_len="uniform:1:50", shared_prefix_len=64, num_prefix_groups=3, seed=0
    )
    specs = take(synthetic(cfg, builder), 30)
    ids = [encode(tk, spec.prompt) for spec in specs]
    for i, spec in enumerate(specs):
        assert len(ids[i]) == spec.input_len
        assert 64 + 1 <= spec.input_len <= 64 + 50
    for i in range(len(specs) - 3):
        assert ids[i][:64] == ids[i + 3][:64]
        assert ids[i][:64] != ids[i + 1][:64]
        assert ids[i][64:] != ids[i + 3][64:]  # the rest is each request's own
    assert len({tuple(x[:64]) for x in ids}) == 3


@pytest.mark.parametrize(("prefix", "groups"), [(64, 1), (10, 4), (0, 2)])
def test_shared_prefix_counts_in_the_input_length(
    tk: Any, builder: PromptBuilder, prefix: int, groups: int
) -> None:
    cfg = WorkloadConfig(input_len="10", shared_prefix_len=prefix, num_prefix_groups=groups)
    specs = take(synthetic(cfg, builder), 8)
    assert all(spec.input_len == prefix + 10 for spec in specs)
    assert all(len(encode(tk, spec.prompt)) == prefix + 10 for spec in specs)
    if prefix:
        firsts = {tuple(encode(tk, spec.prompt)[:prefix]) for spec in specs}
        assert len(firsts) == groups


@pytest.mark.parametrize(
    "cfg",
    [
        WorkloadConfig(shared_prefix_len=-1),
        WorkloadConfig(num_prefix_groups=0),
        WorkloadConfig(input_len="uniform:9:1"),
        WorkloadConfig(output_len="0"),
    ],
)
def test_bad_workloads_are_refused(builder: PromptBuilder, cfg: WorkloadConfig) -> None:
    with pytest.raises(ValueError):
        next(synthetic(cfg, builder))


# ---- trace replays ----------------------------------------------------------------------------


def common_run(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    k = 0
    while k < min(len(a), len(b)) and a[k] == b[k]:
        k += 1
    return k


def test_mooncake_replay_has_the_trace_lengths(tk: Any, builder: PromptBuilder) -> None:
    trace = read_trace(DATA / "mooncake_sample.jsonl", "mooncake")
    specs = from_trace(trace, builder, seed=0)
    assert len(specs) == len(trace.rows)
    for spec, row in zip(specs, trace.rows, strict=True):
        assert len(encode(tk, spec.prompt)) == spec.input_len == row.input_len
        assert spec.output_len == row.output_len


def test_mooncake_hash_ids_share_512_token_blocks(tk: Any, builder: PromptBuilder) -> None:
    trace = read_trace(DATA / "mooncake_sample.jsonl", "mooncake")
    ids = [encode(tk, spec.prompt) for spec in from_trace(trace, builder, seed=0)]
    shared = different = 0
    for (i, a), (j, b) in itertools.combinations(enumerate(trace.rows), 2):
        k = common_run(a.hash_ids, b.hash_ids)
        shortest = min(len(ids[i]), len(ids[j]))
        n = min(k * 512, shortest)
        assert ids[i][:n] == ids[j][:n], (i, j)
        if n < shortest:  # the first block after the common run differs
            end = min(n + 512, shortest)
            assert ids[i][n:end] != ids[j][n:end], (i, j)
        if k == 0:
            assert ids[i][:512] != ids[j][:512], (i, j)
            different += 1
        else:
            shared += 1
    assert shared >= 10 and different >= 10  # the sample has both kinds of pairs


def test_mooncake_replay_is_seeded(builder: PromptBuilder) -> None:
    trace = read_trace(DATA / "mooncake_sample.jsonl", "mooncake")
    first = from_trace(trace, builder, seed=0)
    assert from_trace(trace, builder, seed=0) == first
    assert all(
        a.prompt != b.prompt for a, b in zip(first, from_trace(trace, builder, 1), strict=True)
    )


@pytest.mark.parametrize(
    ("name", "fmt"), [("azure_sample.csv", "azure"), ("burstgpt_sample.csv", "burstgpt")]
)
def test_csv_trace_replay_gives_one_spec_per_row(
    tk: Any, builder: PromptBuilder, name: str, fmt: str
) -> None:
    trace = read_trace(DATA / name, fmt)
    specs = from_trace(trace, builder, seed=0)
    assert len(specs) == len(trace.rows) == 14
    for spec, row in zip(specs, trace.rows, strict=True):
        assert len(encode(tk, spec.prompt)) == spec.input_len == row.input_len
        assert spec.output_len == row.output_len
    assert len({spec.prompt[:200] for spec in specs}) == len(specs)  # no sharing without hash ids


# ---- ShareGPT ---------------------------------------------------------------------------------


def usable_pairs(tk: Any) -> dict[str, tuple[int, int]]:
    """First human turn -> (its tokens, the reply's tokens), for the sample's usable entries."""
    out = {}
    for item in json.loads(SHAREGPT.read_text()):
        if item["id"] not in SHAREGPT_SKIPPED:
            prompt, reply = (turn["value"] for turn in item["conversations"][:2])
            out[prompt] = (len(encode(tk, prompt)), len(encode(tk, reply)))
    return out


def test_sharegpt_prompts_are_first_human_turns_with_reply_lengths(tk: Any) -> None:
    pairs = usable_pairs(tk)
    assert len(pairs) == 9
    specs = take(sharegpt(read_sharegpt(SHAREGPT, tk), seed=0), 3 * len(pairs))
    for spec in specs:
        assert (spec.input_len, spec.output_len) == pairs[spec.prompt]
    counts = {prompt: 0 for prompt in pairs}
    for spec in specs:
        counts[spec.prompt] += 1
    assert set(counts.values()) == {3}  # endless: every pair once per pass


def test_sharegpt_skips_single_turns_and_short_pairs(tk: Any) -> None:
    items = {item["id"]: item for item in json.loads(SHAREGPT.read_text())}
    skipped = {items[k]["conversations"][0]["value"] for k in SHAREGPT_SKIPPED}
    prompts = {spec.prompt for spec in take(sharegpt(read_sharegpt(SHAREGPT, tk), seed=0), 100)}
    assert len(prompts) == 9
    assert not prompts & skipped


def test_sharegpt_order_is_seeded(tk: Any) -> None:
    def order(seed: int) -> list[str]:
        return [spec.prompt for spec in take(sharegpt(read_sharegpt(SHAREGPT, tk), seed), 27)]

    assert order(0) == order(0)
    assert order(0) != order(1)
    assert order(0)[:9] != order(0)[9:18]  # a fresh shuffle each pass


@pytest.mark.parametrize(("output_len", "values"), [("32", {32}), ("uniform:3:4", {3, 4})])
def test_sharegpt_given_output_len_replaces_the_reply_length(
    tk: Any, output_len: str, values: set[int]
) -> None:
    specs = take(sharegpt(read_sharegpt(SHAREGPT, tk), seed=0, output_len=output_len), 60)
    assert {spec.output_len for spec in specs} == values
    pairs = usable_pairs(tk)
    assert all(spec.input_len == pairs[spec.prompt][0] for spec in specs)


def test_sharegpt_accepts_openai_style_messages(tmp_path: Path, tk: Any) -> None:
    path = tmp_path / "messages.json"
    prompt = "Explain recursion to a new programmer."
    reply = "A recursive function solves a problem by calling itself on a smaller part of it."
    messages = [{"role": "user", "content": prompt}, {"role": "assistant", "content": reply}]
    path.write_text(json.dumps([{"messages": messages}]))
    spec = next(sharegpt(read_sharegpt(path, tk), seed=0))
    assert spec == RequestSpec(prompt, len(encode(tk, prompt)), len(encode(tk, reply)))


GOOD_TURNS = [
    {"from": "human", "value": "a long enough question"},
    {"from": "gpt", "value": "a long enough reply"},
]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{not json", "not a readable JSON file"),
        (json.dumps({"conversations": GOOD_TURNS}), "expected a JSON list"),
        (
            json.dumps([{"conversations": GOOD_TURNS}, {"id": "x"}]),
            "entry 1 has no 'conversations'",
        ),
        (json.dumps([{"conversations": "hello"}]), "entry 0 has no 'conversations'"),
        (json.dumps(["just a string"]), "entry 0 has no 'conversations'"),
        (json.dumps([{"conversations": [GOOD_TURNS[0], {"from": "gpt"}]}]), "no 'value' text"),
        (json.dumps([{"conversations": [GOOD_TURNS[0], {"value": 3}]}]), "no 'value' text"),
        (json.dumps([{"conversations": [GOOD_TURNS[0], "a reply"]}]), "not an object"),
        (json.dumps([]), "no usable conversation"),
        (json.dumps([{"conversations": GOOD_TURNS[:1]}]), "no usable conversation"),
    ],
)
def test_malformed_sharegpt_files_name_the_file(
    tmp_path: Path, tk: Any, text: str, message: str
) -> None:
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(ValueError, match=re.escape(str(path)) + ".*" + re.escape(message)):
        next(sharegpt(read_sharegpt(path, tk), seed=0))


def test_missing_sharegpt_file_names_the_file(tmp_path: Path, tk: Any) -> None:
    path = tmp_path / "nowhere.json"
    with pytest.raises(ValueError, match=re.escape(str(path))):
        next(sharegpt(read_sharegpt(path, tk), seed=0))


def test_sharegpt_counts_what_it_dropped_and_how_often_it_reuses(tmp_path: Path, tk: Any) -> None:
    """Before, short pairs were dropped and the rest recycled to reach --num-requests without
    a word: the counts now reach config.json and the note bench run prints."""

    def conv(prompt: str, reply: str) -> dict[str, Any]:
        return {"conversations": [{"value": prompt}, {"value": reply}]}

    items = [
        conv("a long enough question here", "a long enough reply there"),
        conv("another long enough question", "another long enough reply"),
        {"conversations": [{"value": "only one turn in this one"}]},
        conv("hi", "a long enough reply there"),
        conv(" word" * 1100, "a long enough reply there"),
    ]
    path = tmp_path / "sg.json"
    path.write_text(json.dumps(items))
    data = read_sharegpt(path, tk)
    assert len(data.pairs) == 2
    assert data.as_dict() == {
        "path": str(path),
        "conversations": 5,
        "used": 2,
        "dropped_single_turn": 1,
        "dropped_too_short": 1,
        "dropped_too_long": 1,
    }
    text = data.describe(num_requests=7)
    assert "2 of 5 conversations used (3 dropped" in text
    assert "7 requests reuse each about 3.5 times" in text
    assert "reuse" not in data.describe(num_requests=2)
