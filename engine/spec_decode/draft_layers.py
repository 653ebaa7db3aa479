"""A self-speculative draft: the target's first L layers, its final norm and its LM head
(LayerSkip-style early exit, here without the early-exit training that makes it accurate:
what it proposes is what the untrained exit gives). It runs as L-layer decode steps, one per
draft token, through the same paged cache: it writes those layers' K/V at the draft
positions, which the verifying pass writes again (the same values, from the same weights and
inputs) before anything reads them, so the draft costs no cache of its own. Its proposals are
greedy (argmax), a one-hot q for the rejection sampler."""

from __future__ import annotations

import torch

from engine.core.request import Request
from engine.runner import ModelRunner, StepInputs


class DraftLayersProposer:
    def __init__(
        self, runner: ModelRunner, num_layers: int, block_tables: dict[str, list[int]]
    ) -> None:
        self.runner = runner
        self.num_layers = num_layers
        self.block_tables = block_tables  # the KV manager's: the draft's slots are allocated

    def num_wanted(self, req: Request, k: int) -> int:
        return k

    @torch.inference_mode()
    def propose(self, batch: list[tuple[Request, int]]) -> None:
        """Draft token j of each request is the early exit's argmax after its last token and
        drafts 0..j-1: one batched L-layer decode step per j."""
        for req, _ in batch:
            req.spec_token_ids = []
        runner = self.runner
        for j in range(max((k for _, k in batch), default=0)):
            active = [req for req, k in batch if k > j]
            tokens = [(req.spec_token_ids or req.token_ids)[-1] for req in active]
            starts = [req.num_tokens - 1 + j for req in active]
            tables = [self.block_tables[req.request_id] for req in active]
            step = StepInputs(tokens, starts, [1] * len(active), tables)
            logits = runner.logits(step, list(range(len(active))), self.num_layers)
            assert logits is not None
            drafts = logits.argmax(dim=-1).tolist()
            for req, token in zip(active, drafts, strict=True):
                req.spec_token_ids.append(token)
