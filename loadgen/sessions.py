"""Multi-turn conversations (as AIPerf and SGLang's multi-turn bench send them): each later
turn carries every earlier turn, the server's replies included, as its context, after a think
time; TTFT is then reported turn by turn, where a prefix cache shows (or fails to show) its
worth."""

from __future__ import annotations

import dataclasses
import itertools
from collections import defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from loadgen.metrics import distribution
from loadgen.records import RequestRecord
from loadgen.workload import LengthDist, RequestSpec, ShareGPT


@dataclass(frozen=True, slots=True)
class Session:
    """One conversation: its user turns in order (each turn's own new text and lengths), and
    the pause between a reply's end and the next turn."""

    turns: tuple[RequestSpec, ...]
    think_s: float = 0.0


def next_turn(spec: RequestSpec, history: tuple[tuple[str, str], ...], context: int) -> RequestSpec:
    """A turn as sent: its text after the whole conversation so far; `context` is the
    conversation's tokens before it (earlier prompts and replies), counted into input_len."""
    return dataclasses.replace(spec, input_len=spec.input_len + context, history=history)


def synthetic_sessions(
    stream: Iterator[RequestSpec], turns: str, think_s: float, seed: int
) -> Iterator[Session]:
    """Sessions whose turns are the next specs of a synthetic stream (their own lengths)."""
    count = LengthDist.parse(turns)
    rng = np.random.default_rng([seed, 5])
    while True:
        yield Session(tuple(itertools.islice(stream, count.sample(rng))), think_s)


def sharegpt_sessions(
    data: ShareGPT, turns: str, think_s: float, seed: int, output_len: str | None = None
) -> Iterator[Session]:
    """ShareGPT conversations turn by turn: user turns as prompts, the replies' lengths as
    output lengths, up to `turns` turns (a conversation with fewer gives what it has)."""
    count = LengthDist.parse(turns)
    fixed_out = LengthDist.parse(output_len) if output_len is not None else None
    rng = np.random.default_rng([seed, 6])
    while True:
        for k in rng.permutation(len(data.dialogues)):
            convo = data.dialogues[k][: count.sample(rng)]
            yield Session(
                tuple(
                    RequestSpec(p, n_in, fixed_out.sample(rng) if fixed_out else n_out)
                    for p, n_in, n_out in convo
                ),
                think_s,
            )


def multi_turn_summary(records: Sequence[RequestRecord]) -> dict[str, Any]:
    """Per-turn TTFT and prompt size (TTFT grows with the context unless its prefix is
    cached), and how many conversations ended early on a failed turn."""
    measured = [r for r in records if not r.warmup and r.session is not None]
    by_turn: dict[int, list[RequestRecord]] = defaultdict(list)
    by_session: dict[int, list[RequestRecord]] = defaultdict(list)
    for r in measured:
        by_turn[r.turn or 0].append(r)
        by_session[r.session].append(r)  # type: ignore[index]
    per_turn = {}
    for turn in sorted(by_turn):
        ok = [r for r in by_turn[turn] if r.ok]
        per_turn[str(turn + 1)] = {
            "requests": len(by_turn[turn]),
            "completed": len(ok),
            "ttft_s": distribution([r.first_chunk_s - r.send_s for r in ok]),  # type: ignore[operator]
            "mean_prompt_tokens": float(np.mean([r.prompt_tokens or 0 for r in ok]))
            if ok
            else None,
        }
    turns_done = [sum(r.ok for r in rs) for rs in by_session.values()]
    return {
        "conversations": len(by_session),
        "turns_completed": distribution(turns_done),
        "cut_short": sum(any(not r.ok for r in rs) for rs in by_session.values()),
        "per_turn": per_turn,
    }
