"""Verification of draft tokens against the target model's logits at those positions.

Greedy: keep drafts while each equals the target's argmax, then add the target's own token at
the first disagreement (or after the last draft): the output is exactly non-speculative greedy.

Sampling: rejection sampling (Leviathan et al. 2023, Chen et al. 2023). Draft x_i drawn from q_i
is accepted with probability min(1, p_i(x_i) / q_i(x_i)); at the first rejection the token is
drawn from the residual max(0, p_i - q_i), normalized, and the rest discarded; if all are
accepted one more comes from p after the last. Each emitted token then has exactly the target's
distribution p. Our proposers are deterministic (q_i is one-hot at x_i): acceptance is p_i(x_i),
the residual is p_i without x_i."""

from __future__ import annotations

import torch

from engine.core.request import Request
from engine.sampler import draw, probabilities


def rejection_sample(
    target: torch.Tensor,  # [s + 1, vocab] float32 probabilities, on the CPU
    drafts: list[int],  # s tokens
    generator: torch.Generator,
    draft_probs: torch.Tensor | None = None,  # [s, vocab]; None: one-hot at each draft
) -> list[int]:
    """The accepted drafts and one token of the target's: 1 to s + 1 tokens."""
    out: list[int] = []
    uniform = torch.rand(len(drafts), generator=generator)
    for i, x in enumerate(drafts):
        p = target[i]
        q_x = 1.0 if draft_probs is None else float(draft_probs[i, x])
        if q_x > 0 and float(uniform[i]) < min(1.0, float(p[x]) / q_x):
            out.append(x)
            continue
        if draft_probs is None:
            residual = p.clone()
            residual[x] = 0.0
        else:
            residual = (p - draft_probs[i]).clamp_(min=0.0)
        if float(residual.sum()) <= 0.0:  # p == q: a rejection has probability 0; be safe
            residual = p
        out.append(draw(residual, generator))
        return out
    out.append(draw(target[len(drafts)], generator))
    return out


def verify(
    logits: torch.Tensor,  # [sum(s + 1), vocab]: each request's rows, in batch order
    batch: list[tuple[Request, list[int]]],  # (request, its s drafts)
    generator: torch.Generator,
) -> list[list[int]]:
    """Each request's emitted tokens (accepted drafts + one of the target's)."""
    greedy = logits.argmax(dim=-1).tolist()
    sampled = [r for r, _ in batch if not r.params.greedy]
    probs = None
    if sampled:
        rows = [r.params for r, d in batch for _ in range(len(d) + 1)]
        probs = probabilities(logits, rows).cpu()
    results, row = [], 0
    for req, drafts in batch:
        n = len(drafts) + 1
        if req.params.greedy:
            target = greedy[row : row + n]
            a = 0
            while a < len(drafts) and drafts[a] == target[a]:
                a += 1
            results.append(target[: a + 1])
        else:
            assert probs is not None
            gen = req.generator or generator
            results.append(rejection_sample(probs[row : row + n], drafts, gen))
        row += n
    return results
