"""The engine's side of speculative decoding, around each step: which decoding requests draft
and how many tokens (before scheduling), their drafts (after), and the counters of what the
verifier accepted (after the forward pass)."""

from __future__ import annotations

from typing import Any

from engine.config import SpeculativeConfig
from engine.core.request import Request
from engine.core.scheduler import SchedulerOutput
from engine.spec_decode import Proposer


class Speculator:
    """`proposer`: the config's (make_proposer), or the simulated engine's (engine/sim)."""

    def __init__(self, config: SpeculativeConfig, proposer: Proposer, max_model_len: int) -> None:
        self.k = config.num_speculative_tokens
        self.max_model_len = max_model_len
        self.proposer = proposer
        # Drafts verified (one per request and step that had any), draft tokens, accepted
        # ones, and accepted ones by draft position (vLLM's spec_decode counters).
        self.drafts = self.draft_tokens = self.accepted_tokens = 0
        self.accepted_per_pos = [0] * self.k
        # Decoding requests the proposer was asked for a draft, and of those the ones it
        # proposed for (n-gram lookup finds no match in the rest): the draft share.
        self.lookups = self.proposals = 0

    def want_drafts(self, running: list[Request]) -> list[Request]:
        """Before scheduling: the decoding requests that want room for drafts (at most k,
        never past max_tokens or the context length), `num_spec_wanted` set."""
        candidates = []
        for req in running:
            req.spec_token_ids = []
            if req.num_computed_tokens != req.num_tokens - 1 or not req.num_output_tokens:
                continue  # a prefill (or a recompute after preemption)
            if req.params.processes_logits:
                continue  # penalties, bias, min_p: the plain sampler's (not the verifier's)
            k = min(
                self.k,
                req.params.max_tokens - req.num_output_tokens - 1,
                self.max_model_len - req.num_tokens - 1,
            )
            if k <= 0:
                continue
            self.lookups += 1
            if (wanted := self.proposer.num_wanted(req, k)) > 0:
                self.proposals += 1
                req.num_spec_wanted = wanted
                candidates.append(req)
        return candidates

    def propose(self, candidates: list[Request], out: SchedulerOutput) -> None:
        """After scheduling: drafts for the requests granted room for some."""
        batch = []
        for req in candidates:
            req.num_spec_wanted = 0
            granted = out.num_spec.get(req.request_id, 0)
            if granted:
                batch.append((req, granted))
            else:
                req.spec_token_ids = []
        if batch:
            self.proposer.propose(batch)
            for req, granted in batch:
                assert len(req.spec_token_ids) == granted, "a proposer broke its contract"

    def count(self, sampled: list[tuple[Request, list[int]]]) -> dict[str, int]:
        """Count what the verifier accepted; each verified request's rejected drafts."""
        rejected = {}
        for req, tokens in sampled:
            drafts = len(req.spec_token_ids)
            if not drafts:
                continue
            accepted = len(tokens) - 1
            rejected[req.request_id] = drafts - accepted
            self.drafts += 1
            self.draft_tokens += drafts
            self.accepted_tokens += accepted
            for i in range(accepted):
                self.accepted_per_pos[i] += 1
        return rejected


def speculation_stats(spec: Speculator | None) -> dict[str, Any]:
    """The counters (zeros without speculation); acceptance rate = accepted / draft tokens,
    mean acceptance length = tokens per verified draft, 1 + accepted / drafts (vLLM's
    definitions)."""
    drafts = spec.drafts if spec else 0
    tokens = spec.draft_tokens if spec else 0
    accepted = spec.accepted_tokens if spec else 0
    return {
        "spec_decode_num_drafts": drafts,
        "spec_decode_num_draft_tokens": tokens,
        "spec_decode_num_accepted_tokens": accepted,
        "spec_decode_num_accepted_tokens_per_pos": list(spec.accepted_per_pos) if spec else [],
        "spec_decode_num_lookups": spec.lookups if spec else 0,
        "spec_decode_num_proposals": spec.proposals if spec else 0,
        "spec_decode_acceptance_rate": accepted / tokens if tokens else None,
        "spec_decode_mean_acceptance_length": 1 + accepted / drafts if drafts else None,
    }
