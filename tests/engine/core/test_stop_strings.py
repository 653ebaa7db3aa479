"""Stop strings: bounded (count, length), found across token boundaries, and matched with
work per token that depends on neither the text's length nor the number of strings."""

from typing import Any

import pytest

from engine import SamplingParams
from engine.config import EngineConfig
from engine.core import stop_strings
from engine.core.stop_strings import MAX_STOP_CHARS, MAX_STOP_STRINGS, StopMatcher
from engine.engine import LLMEngine
from engine.serving.protocol import APIError, parse_completion


@pytest.fixture(scope="module")
def engine() -> LLMEngine:
    return LLMEngine(EngineConfig.from_kwargs("tiny-smollm2", max_num_seqs=4, seed=0))


def run(engine: LLMEngine, params: SamplingParams) -> Any:
    engine.add_request("r", "Once upon a time", params)
    last = None
    while engine.has_unfinished_requests():
        for o in engine.step():
            last = o
    return last.outputs[0]


def find_streaming(m: StopMatcher, chunks: list[str]) -> tuple[int, str] | None:
    text = ""
    for chunk in chunks:
        before = len(text)
        text += chunk
        if found := m.find(text, before):
            return found
    return None


def test_matcher_finds_the_leftmost_stop_completed_by_new_text() -> None:
    m = StopMatcher(("cd", "bcdx", "zz"))
    assert find_streaming(m, ["a", "b", "c", "d", "x"]) == (2, "cd")  # across chunks
    assert find_streaming(m, ["a", "b", "c", "dx"]) == (1, "bcdx")  # both end now: leftmost
    assert find_streaming(m, ["z", "az", "z"]) == (2, "zz")
    assert StopMatcher(("b", "ab")).find("xab", 0) == (1, "ab")


def test_many_stops_behave_like_the_one_that_matches(engine: LLMEngine) -> None:
    base = dict(max_tokens=40, temperature=0.0, ignore_eos=True)
    text = run(engine, SamplingParams(**base)).text  # type: ignore[arg-type]
    stop = text[len(text) // 2 : len(text) // 2 + 3]
    decoys = [f"\0{i}" for i in range(MAX_STOP_STRINGS - 1)]
    for keep in (False, True):
        one = run(engine, SamplingParams(**base, stop=[stop], include_stop_str_in_output=keep))
        many = run(
            engine,
            SamplingParams(**base, stop=[*decoys, stop], include_stop_str_in_output=keep),
        )
        cut = text.index(stop) + (len(stop) if keep else 0)
        assert (many.text, many.stop_reason, many.finish_reason) == (text[:cut], stop, "stop")
        assert (one.text, one.stop_reason) == (many.text, many.stop_reason)


def test_work_per_token_is_one_scan_of_a_bounded_tail(
    engine: LLMEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    scans: list[tuple[int, int, int]] = []  # (text length, new characters, scanned window)
    find = StopMatcher.find

    def counting_find(self: StopMatcher, text: str, new_from: int) -> Any:
        window = len(text) - self.window_start(len(text), new_from)
        scans.append((len(text), len(text) - new_from, window))
        return find(self, text, new_from)

    monkeypatch.setattr(StopMatcher, "find", counting_find)
    stops = [f"\0{i:03}" + "x" * 20 for i in range(MAX_STOP_STRINGS)]  # never match
    out = run(engine, SamplingParams(max_tokens=120, temperature=0.0, ignore_eos=True, stop=stops))
    assert len(out.token_ids) == 120
    assert len(scans) == 120  # one scan per token, however many stop strings
    longest = max(map(len, stops))
    assert all(window <= new + longest - 1 for _, new, window in scans)
    most_new = max(new for _, new, _ in scans)
    assert scans[-1][0] > 3 * (longest + most_new)  # the text outgrew the tail


def test_too_many_or_too_long_stops_are_refused_with_the_limit() -> None:
    too_many = [f"s{i}" for i in range(MAX_STOP_STRINGS + 1)]
    too_long = ["x" * (MAX_STOP_CHARS + 1)]
    for stop, limit in ((too_many, str(MAX_STOP_STRINGS)), (too_long, str(MAX_STOP_CHARS))):
        with pytest.raises(APIError, match=limit) as e:
            parse_completion({"prompt": "hi", "stop": stop})
        assert (e.value.status, e.value.param) == (400, "stop")
        with pytest.raises(ValueError, match=limit):
            SamplingParams(stop=stop)
    ok = [f"s{i}" for i in range(MAX_STOP_STRINGS - 1)] + ["x" * MAX_STOP_CHARS]
    assert parse_completion({"prompt": "hi", "stop": ok}).params.stop == ok


def test_one_compiled_matcher_serves_every_child_of_a_request() -> None:
    stops = ("alpha", "beta")
    assert stop_strings.matcher(stops) is stop_strings.matcher(tuple(list(stops)))


def reference_find(stops: tuple[str, ...], text: str, new_from: int) -> tuple[int, str] | None:
    """Every (start, stop) whose end lies in the new text; the leftmost, longest at a tie."""
    hits = [
        (i, -len(s), s)
        for s in stops
        for i in range(len(text) - len(s) + 1)
        if text.startswith(s, i) and i + len(s) > new_from
    ]
    return (min(hits)[0], min(hits)[2]) if hits else None


def test_matches_are_the_references_on_random_text_and_an_adversarial_set() -> None:
    import random

    rng = random.Random(0)
    for _ in range(300):
        stops = tuple("".join(rng.choices("ab", k=rng.randint(1, 6))) for _ in range(4))
        text = "".join(rng.choices("ab", k=rng.randint(0, 30)))
        new_from = rng.randint(0, len(text))
        assert StopMatcher(stops).find(text, new_from) == reference_find(stops, text, new_from)
    # No common prefix, long runs of one letter: what made a regex alternation backtrack.
    adversarial = tuple("a" * i + "b" + "a" * (MAX_STOP_CHARS - 1 - i) for i in range(128))
    m = StopMatcher(adversarial)
    text = "a" * 1500
    assert m.find(text, 1499) is None
    text += "b" + "a" * 10
    assert m.find(text, 1500) is None  # 'b' needs 511 - i more a's after it
    text += "a" * (MAX_STOP_CHARS - 11)
    want = reference_find(adversarial, text, len(text) - 1)
    assert want is not None and m.find(text, len(text) - 1) == want
