"""Speculative decoding on the simulated engine (engine/sim/speculation.py): acceptance drawn
at the rates given, the engine's own speculator and scheduler around it, draft-model time
from the step-time model, and the flag's checks."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pytest

from engine.config import EngineConfig
from engine.core.request import SamplingParams
from engine.model.shapes import model_shape
from engine.sim.clock import VirtualClock
from engine.sim.sim_engine import SimEngine
from engine.sim.speculation import Acceptance, DraftShare, per_request_shares
from tests.engine.sim.test_sim import FixedStep, sim_run


def _sim(
    spec: dict[str, Any] | None,
    acceptance: Acceptance | None,
    draft_share: float | tuple[float, ...] = 1.0,
    **kwargs: Any,
) -> SimEngine:
    config = EngineConfig.from_kwargs(
        "tiny-llama", max_model_len=1024, speculative_config=spec, **kwargs
    )
    config.dtype = config.cache.kv_cache_dtype = "float32"
    shape = model_shape("tiny-llama")
    share = DraftShare.parse(list(draft_share) if isinstance(draft_share, tuple) else draft_share)
    return SimEngine(config, shape, FixedStep(), VirtualClock(), acceptance, share)


def _drain(sim: SimEngine, requests: int, max_tokens: int) -> tuple[int, dict[str, int]]:
    for i in range(requests):
        params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
        sim.add_request(f"r{i}", list(range(3, 40 + i)), params, 0.0)
    steps, tokens = 0, {}
    while sim.has_unfinished_requests():
        for o in sim.step():
            if o.finished:
                tokens[o.request_id] = len(o.outputs[0].token_ids)
        steps += 1
    return steps, tokens


def test_drafts_are_accepted_at_the_rates_given_and_outputs_keep_their_length() -> None:
    rates = [0.9, 0.6, 0.3, 0.1]
    ngram = {"method": "ngram", "num_speculative_tokens": 4}
    sim = _sim(ngram, Acceptance.parse(rates), max_num_seqs=8)
    steps, tokens = _drain(sim, 24, 400)
    assert tokens == {f"r{i}": 400 for i in range(24)}
    stats = sim.spec_stats()
    drafts = stats["spec_decode_num_drafts"]
    assert drafts > 2000
    measured = [n / drafts for n in stats["spec_decode_num_accepted_tokens_per_pos"]]
    assert measured == pytest.approx(rates, abs=0.03)
    assert stats["spec_decode_mean_acceptance_length"] == pytest.approx(1 + sum(rates), abs=0.06)
    plain_steps, plain_tokens = _drain(_sim(None, None, max_num_seqs=8), 24, 400)
    assert plain_tokens == tokens
    assert steps < plain_steps / 2  # ~2.9 tokens a step instead of one
    again = _sim(ngram, Acceptance.parse(rates), max_num_seqs=8)  # the same seed: the same run
    assert _drain(again, 24, 400) == (steps, tokens) and again.spec_stats() == stats
    # n-gram lookup that finds a draft for 40 % of the decodes
    misses = _sim(ngram, Acceptance.parse(rates), draft_share=0.4, max_num_seqs=8)
    _, tokens = _drain(misses, 24, 400)
    assert tokens == {f"r{i}": 400 for i in range(24)}
    stats = misses.spec_stats()
    lookups, proposals = stats["spec_decode_num_lookups"], stats["spec_decode_num_proposals"]
    assert proposals == stats["spec_decode_num_drafts"]  # every draft found room
    assert proposals / lookups == pytest.approx(0.4, abs=0.03)


def test_acceptance_forms_and_their_checks() -> None:
    assert Acceptance.parse(0.5).rates(3) == [0.5, 0.25, 0.125]
    assert Acceptance.parse("0.5").rates(2) == [0.5, 0.25]
    assert Acceptance.parse("0.9,0.5,0.2").rates(2) == [0.9, 0.5]
    assert Acceptance.parse([1.0]).rates(1) == [1.0]
    for bad, message in (
        ("0.5,0.7", "cannot rise"),
        ("1.5", r"in \[0, 1\]"),
        ("high", "comma-separated"),
        (True, "a rate or a list"),
    ):
        with pytest.raises(ValueError, match=message):
            Acceptance.parse(bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="give 4"):
        Acceptance.parse("0.9,0.5").rates(4)


def _records(out: Path) -> list[dict[str, Any]]:
    lines = (out / "requests.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if not r["warmup"]]


@pytest.mark.parametrize("accept", [0.0, 1.0])
def test_known_draft_and_verify_times_come_out_exactly(
    tmp_path: Path, monkeypatch, accept: float
) -> None:
    """Steps of 10 ms, a draft of 1 of the model's layers per draft position: a decode step
    drafting k tokens takes 10 ms * (1 + k / layers), and yields 1 token (nothing accepted)
    or k + 1 (everything)."""
    import loadgen.sim_setup as setup

    monkeypatch.setattr(setup, "step_model_for", lambda *a, **k: FixedStep(0.01))
    layers = model_shape("tiny-llama").num_layers
    spec = {"method": "draft_layers", "num_speculative_tokens": 2, "num_draft_layers": 1}
    rc, printed, out = sim_run(
        tmp_path,
        rate=0.2,
        num_requests=6,
        output_len="13",
        speculative_config=json.dumps(spec),
        sim_acceptance=accept,
    )
    assert rc == 0, printed
    step2 = 0.01 * (1 + 2 / layers)  # a decode step with two draft positions
    for r in _records(out):
        assert r["output_tokens"] == 13
        assert r["first_chunk_s"] - r["send_s"] == pytest.approx(0.01, rel=1e-9)
        gaps = [b - a for a, b in itertools.pairwise(r["chunk_s"])]
        # None kept: 10 steps drafting 2, then 1 (one token left after it), then none;
        # all kept: 1 + 3 + 3 + 3 + 3 tokens.
        expected = [step2] * 10 + [0.01 * (1 + 1 / layers), 0.01] if not accept else [step2] * 4
        assert gaps == pytest.approx(expected, rel=1e-9), r
    summary = json.loads((out / "summary.json").read_text())
    assert summary["telemetry"]["spec_acceptance_rate"] == accept
    assert json.loads((out / "config.json").read_text())["engine"]["sim"]["speculation"] == {
        "per_token": accept,
        "draft_share": 1.0,
    }


def test_per_request_draft_shares_spread_the_requests_and_come_back_from_their_chunks() -> None:
    """Shares 0 and 1 by request: half the requests never get a draft (one token a step),
    the rest always do; per_request_shares reads each request's share back from its chunks
    (one a step, 1 + accepted tokens), as the summary does from a real run's records."""
    rates = [0.9, 0.6, 0.3, 0.1]
    ngram = {"method": "ngram", "num_speculative_tokens": 4}
    sim = _sim(ngram, Acceptance.parse(rates), draft_share=(0.0, 1.0), max_num_seqs=8)
    chunks: dict[str, list[int]] = {}
    for i in range(24):
        params = SamplingParams(max_tokens=300, ignore_eos=True)
        sim.add_request(f"r{i}", list(range(3, 40 + i)), params, 0.0)
    while sim.has_unfinished_requests():
        for o in sim.step():  # a step's tokens of a request: one streamed chunk
            if o.new_token_ids:
                chunks.setdefault(o.request_id, []).append(len(o.new_token_ids))
    back = per_request_shares(list(chunks.values()), Acceptance.parse(rates), 4)
    never = [s for s in back if s == 0.0]
    assert 6 <= len(never) <= 18 and len(never) + sum(s > 0.85 for s in back) == 24
    for rid, tokens in chunks.items():  # the same share for a request at every step
        share = DraftShare((0.0, 1.0)).of(rid, sim.config.seed)
        assert (max(tokens[1:]) == 1) == (share == 0.0), rid


def test_draft_share_forms_and_their_checks() -> None:
    assert DraftShare.parse(None).shares == (1.0,) and DraftShare.parse(0.4).describe() == 0.4
    spread = DraftShare.parse("0.2,0.8,1")
    assert spread.shares == (0.2, 0.8, 1.0) and spread.mean == pytest.approx(2 / 3)
    assert DraftShare.parse([0.2, 0.8, 1.0]) == spread
    assert spread.describe() == {"mean": pytest.approx(2 / 3), "per_request": [0.2, 0.8, 1.0]}
    drawn = {spread.of(f"r{i}", 7) for i in range(60)}
    assert drawn == {0.2, 0.8, 1.0} and spread.of("r3", 7) == spread.of("r3", 7)
    for bad in ("half", "0.2,x", "1.5", [0.5, -0.1], True):
        with pytest.raises(ValueError, match="--sim-draft-share"):
            DraftShare.parse(bad)  # type: ignore[arg-type]
    assert per_request_shares([[1, 1, 1], [1, 4, 4, 4], [2]], Acceptance.parse(0.5), 2) == [
        0.0,
        1.0,  # 3 extra tokens a step, more than the 0.75 a draft brings on average: clipped
    ]
    # scaled to the run's counted share (of decode steps) first; one decode step is too
    # few to tell: [1, 3] left out
    alone = per_request_shares([[1, 2, 2, 2], [1, 3]], Acceptance.parse(0.5), 2, 0.5)
    assert alone == [0.5]
    # raw 4/3 (3 steps) and 8/3 (2 steps): 28/3 over 5 steps; scale 0.5 * 5 / (28/3) = 15/56
    both = per_request_shares([[1, 2, 2, 2], [1, 3, 3]], Acceptance.parse(0.5), 2, 0.5)
    assert both == pytest.approx([4 / 3 * 15 / 56, 8 / 3 * 15 / 56], abs=1e-4)


def test_bench_run_takes_per_request_shares_and_its_summary_gives_them(tmp_path: Path) -> None:
    """The three doors' last: `bench run --engine sim --sim-draft-share 0,1` says so in
    config.json, and the summary's per-request shares (from the records) show the split."""
    ngram = {"method": "ngram", "num_speculative_tokens": 3}
    rc, printed, out = sim_run(
        tmp_path,
        num_requests=12,
        output_len="40",
        speculative_config=json.dumps(ngram),
        sim_acceptance="0.9,0.7,0.5",
        sim_draft_share="0,1",
    )
    assert rc == 0, printed
    sim = json.loads((out / "config.json").read_text())["engine"]["sim"]["speculation"]
    assert sim["draft_share"] == {"mean": 0.5, "per_request": [0.0, 1.0]}
    shares = json.loads((out / "summary.json").read_text())["telemetry"]
    shares = shares["spec_draft_share_by_request"]
    assert len(shares) == 12 and shares == sorted(shares)
    assert 0.0 in shares and max(shares) > 0.7 and not [s for s in shares if 0 < s < 0.5]
