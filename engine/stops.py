"""When a request stops, token by token: its stop strings (on the detokenized text), stop
tokens and EOS, `max_tokens` and the context length; vLLM's rules, `min_tokens` included.
Apart from the engine, which then finishes the request (engine.py: `_process_token`)."""

from __future__ import annotations

from engine.core.request import FinishReason, Request
from engine.model.tokenizer import IncrementalDetokenizer


def check_stop(
    req: Request, token: int, detok: IncrementalDetokenizer | None, max_model_len: int
) -> tuple[FinishReason, bool] | None:
    """After `token` was appended to `req`: why it stops and whether its detokenizer's text is
    flushed then (not after a stop string, whose text is cut at the match), or None. Updates
    the request's text and `stop_reason` on the way."""
    params = req.params
    # min_tokens (vLLM's rule): stop tokens count from that many output tokens on, stop
    # strings only after them (the sampler masks EOS and stop tokens until then).
    stops_count = req.num_output_tokens >= params.min_tokens
    if detok is not None:
        before = len(req.output_text)
        req.output_text += detok.step(req.token_ids)
        matcher = req.stop_matcher if req.num_output_tokens > params.min_tokens else None
        found = matcher.find(req.output_text, before) if matcher else None
        if found is not None:
            idx, stop = found
            end = idx + len(stop) if params.include_stop_str_in_output else idx
            req.output_text = req.output_text[:end]
            req.stop_reason = stop
            return FinishReason.STOP, False
    if stops_count and token in req.stop_token_ids:
        req.stop_reason = token if token in params.stop_token_ids else None
        return FinishReason.STOP, True
    if req.num_output_tokens >= params.max_tokens or req.num_tokens >= max_model_len:
        return FinishReason.LENGTH, True
    return None
