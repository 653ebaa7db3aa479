"""Speculative decoding: a proposer guesses a few next tokens of a decoding request, the target
model scores them all in one forward pass of the step (extra query tokens, like a short prefill
chunk) and `rejection.py` keeps the longest prefix the target agrees with, plus one token of its
own. Greedy output is the target's token for token; sampled output has the target's
distribution (rejection sampling).

A proposer has two calls per step. `num_wanted(req, k)`, before scheduling: how many draft
tokens (at most k) to make room for; the scheduler may grant fewer (token budget). `propose`,
after scheduling (the KV slots exist then): set each request's `spec_token_ids` to exactly the
granted number of tokens."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from engine.config import SpeculativeConfig
    from engine.core.request import Request
    from engine.runner import ModelRunner


class Proposer(Protocol):
    def num_wanted(self, req: Request, k: int) -> int: ...

    def propose(self, batch: list[tuple[Request, int]]) -> None: ...


def make_proposer(
    config: SpeculativeConfig, runner: ModelRunner, block_tables: dict[str, list[int]]
) -> Proposer:
    if config.method == "ngram":
        from engine.spec_decode.ngram import NgramProposer

        return NgramProposer(config.prompt_lookup_min, config.prompt_lookup_max)
    from engine.spec_decode.draft_layers import DraftLayersProposer

    assert config.num_draft_layers is not None, "resolve the config first"
    return DraftLayersProposer(runner, config.num_draft_layers, block_tables)
