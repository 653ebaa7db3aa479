"""A prompt and its sampling parameters into a `Request`: tokenized and checked against the
model (vocabulary, context, token budget) before it touches the engine's state, as vLLM's
input processor does. Safe from another thread while a step runs."""

from __future__ import annotations

from typing import TYPE_CHECKING

from engine.core.request import Request, SamplingParams

if TYPE_CHECKING:
    from engine.engine import LLMEngine


def make_request(
    engine: LLMEngine,
    request_id: str,
    prompt: str | list[int],
    params: SamplingParams | None,
    arrival_time: float | None,
    priority: int,
    ids_checked: bool,
) -> Request:
    """`LLMEngine.make_request`: ValueError, with the reason, for what the engine cannot run.
    ids_checked: the caller made the ids in the vocabulary itself (a simulation's load
    generator)."""
    params = params or SamplingParams()
    if isinstance(prompt, str):
        if engine.tokenizer is None:
            raise ValueError(f"model {engine.config.model!r} has no tokenizer: pass token ids")
        text: str | None = prompt
        ids = engine.tokenizer.encode(prompt)
    else:
        text, ids = None, list(prompt)
    if not ids:
        raise ValueError("the prompt is empty")
    vocab = engine.model_config.vocab_size
    # Checked in C (a Python test per id cost ~0.1 ms a prompt, most of a simulated one)
    if not ids_checked and (
        not set(map(type, ids)) <= {int, bool} or min(ids) < 0 or max(ids) >= vocab
    ):
        raise ValueError(f"prompt token ids must be integers in [0, {vocab})")
    engine.scheduler.check_fits(len(ids), params.max_tokens)
    if params.logit_bias and max(params.logit_bias) >= vocab:
        outside = sorted(t for t in params.logit_bias if t >= vocab)[:5]
        raise ValueError(
            f"logit_bias has token ids outside the vocabulary (size {vocab}): {outside}"
        )
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise ValueError(f"priority must be an integer, got {priority!r}")
    return Request(request_id, ids, params, text, arrival_time, engine.eos_token_ids, priority)
