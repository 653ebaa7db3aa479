"""vLLM's logits processors and penalties, batched over a step's rows: `logit_bias`,
`min_tokens`, and the presence, frequency and repetition penalties, in the order of vLLM's
sampler (all before the greedy argmax and the temperature; `min_p`, which comes after the
temperature, is in sampler.probabilities).

The sampler calls this only when some request of the batch sets one of them, and the work
is tensor operations over the rows that use each: per request, never per vocabulary entry."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.core.request import Request


@dataclass(slots=True)
class _Prepared:
    """A request's constant tensors, made once (on the CPU) at its first step."""

    bias_ids: torch.Tensor | None
    bias_values: torch.Tensor | None
    stop_ids: torch.Tensor  # long; masked until min_tokens (EOS unless ignore_eos, stop_token_ids)
    prompt_ids: torch.Tensor | None  # distinct prompt tokens: the repetition penalty's


def _prepared(req: Request, vocab: int) -> _Prepared:
    if req.logits_prepared is None:
        p = req.params
        bias_ids = bias_values = None
        if p.logit_bias:
            bias_ids = torch.tensor(list(p.logit_bias), dtype=torch.long)
            bias_values = torch.tensor(list(p.logit_bias.values()), dtype=torch.float32)
        prompt = None
        if p.repetition_penalty != 1.0:
            prompt = torch.tensor(req.prompt_token_ids, dtype=torch.long).unique()
        # stop_token_ids are not checked against the vocabulary: one past it can't be masked
        ids = sorted(t for t in req.stop_token_ids if 0 <= t < vocab)
        stops = torch.tensor(ids, dtype=torch.long)
        req.logits_prepared = _Prepared(bias_ids, bias_values, stops, prompt)
    return req.logits_prepared


def apply_processors(logits: torch.Tensor, requests: list[Request]) -> torch.Tensor:
    """Float32 logits [N, vocab] (a new tensor) with each row's request's logit bias,
    min_tokens mask and penalties applied; rows of requests without them are unchanged."""
    device = logits.device
    logits = torch.empty(logits.shape, dtype=torch.float32, device=device).copy_(logits)
    bias_rows, bias_ids, bias_values = [], [], []
    mask_rows, mask_ids = [], []
    penalized: list[int] = []
    for i, req in enumerate(requests):
        p = req.params
        if not p.processes_logits:
            continue
        prep = _prepared(req, logits.shape[1])
        if prep.bias_ids is not None:
            bias_rows.append(torch.full_like(prep.bias_ids, i))
            bias_ids.append(prep.bias_ids)
            bias_values.append(prep.bias_values)
        if req.num_output_tokens < p.min_tokens and len(prep.stop_ids):
            mask_rows.append(torch.full_like(prep.stop_ids, i))
            mask_ids.append(prep.stop_ids)
        if p.presence_penalty or p.frequency_penalty or p.repetition_penalty != 1.0:
            penalized.append(i)
    if bias_ids:
        index = (torch.cat(bias_rows).to(device), torch.cat(bias_ids).to(device))
        logits.index_put_(index, torch.cat(bias_values).to(device), accumulate=True)
    if mask_ids:
        index = (torch.cat(mask_rows).to(device), torch.cat(mask_ids).to(device))
        logits.index_put_(index, torch.tensor(float("-inf"), device=device))
    if penalized:
        _penalize(logits, [(i, requests[i]) for i in penalized])
    return logits


def _penalize(logits: torch.Tensor, rows: list[tuple[int, Request]]) -> None:
    """vLLM's apply_penalties, in place: the repetition penalty over prompt + output tokens
    (positive logits divided, the others multiplied), then frequency x count and presence
    over the output tokens subtracted. Only the entries of tokens a request has seen are
    touched (sparse: O(its tokens), not O(vocab))."""
    vocab = logits.shape[1]
    device = logits.device
    flat = logits.view(-1)

    def positions(pairs: list[tuple[int, torch.Tensor]]) -> torch.Tensor:
        """Flat indices row x vocab + id of each row's token ids (long, on `device`)."""
        if not pairs:
            return torch.empty(0, dtype=torch.long, device=device)
        return torch.cat([ids + i * vocab for i, ids in pairs]).to(device)

    params = [r.params for _, r in rows]
    outputs = [(i, torch.tensor(r.output_token_ids, dtype=torch.long)) for i, r in rows]
    out_pos, counts = positions(outputs).unique(return_counts=True)
    per_row = torch.zeros(logits.shape[0], 3, device=device)  # repetition, frequency, presence
    values = [[p.repetition_penalty, p.frequency_penalty, p.presence_penalty] for p in params]
    per_row[torch.tensor([i for i, _ in rows], device=device)] = torch.tensor(values, device=device)
    if any(p.repetition_penalty != 1.0 for p in params):
        prompts = [(i, _prepared(r, vocab).prompt_ids) for i, r in rows]
        seen = torch.cat([out_pos, positions([(i, ids) for i, ids in prompts if ids is not None])])
        seen = seen.unique()
        rp = per_row[seen // vocab, 0]
        old = flat[seen]
        flat[seen] = torch.where(old > 0, old / rp, old * rp)
    row = out_pos // vocab
    flat[out_pos] -= per_row[row, 1] * counts + per_row[row, 2]
