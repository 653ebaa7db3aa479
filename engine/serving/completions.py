"""POST /v1/completions and /v1/chat/completions: the model checked, the request admitted
(the queue's room), its prompts tokenized off the event loop when long and checked against
the context, then queued in the engine and answered as SSE or whole (streaming.py).

Bad input never reaches the engine: it is answered 4xx with an OpenAI-style error body."""

from __future__ import annotations

import asyncio
import functools
import logging
import time
import uuid
from collections.abc import Callable
from typing import Any

from aiohttp import web

from engine.model.tokenizer import LONG_TEXT_CHARS, Tokenizer
from engine.serving.app_state import ENGINE_KEY, STATE_KEY, ServerState
from engine.serving.guard import read_json
from engine.serving.protocol import (
    APIError,
    ParsedRequest,
    check_logit_bias,
    parse_common,
    parse_completion,
    parse_messages,
)
from engine.serving.streaming import full_response, stream_response

log = logging.getLogger(__name__)


def check_model(state: ServerState, body: dict[str, Any]) -> None:
    model = body.get("model", state.model_name)
    if not isinstance(model, str):
        raise APIError(f"'model' must be a string, got {type(model).__name__}", param="model")
    if model != state.model_name:
        raise APIError(
            f"the model {str(model)[:100]!r} does not exist here; use {state.model_name!r}",
            404,
            param="model",
            code="model_not_found",
        )


def check_capacity(request: web.Request, num_prompts: int, n: int) -> None:
    """Admit a request's sequences (prompts x n) only if the queue has room for all."""
    engine, state = request.app[ENGINE_KEY], request.app[STATE_KEY]
    num_new = num_prompts * n
    if num_new > state.max_queue:
        raise APIError(
            f"the request has {num_new} sequences ({num_prompts} prompts x n={n}); this server "
            f"queues at most {state.max_queue} (--max-queue): send them in smaller requests",
            param="n" if n > 1 else "prompt",
        )
    waiting = engine.num_not_running
    if waiting + num_new > state.max_queue:
        state.rejected_total += 1
        raise APIError(
            f"the server's queue is full ({waiting} of {state.max_queue} sequences waiting, "
            f"{num_new} more asked for); retry later",
            429,
            type_="rate_limit_error",
        )


async def completions(request: web.Request) -> web.StreamResponse:
    """OpenAI completions: `prompt` (text, texts or token ids), streamed as SSE or whole."""
    state = request.app[STATE_KEY]
    body = await read_json(request)
    check_model(state, body)
    parsed = parse_completion(body)
    return await serve(request, parsed, chat=False)


async def chat_completions(request: web.Request) -> web.StreamResponse:
    """OpenAI chat completions: `messages` through the model's chat template."""
    engine, state = request.app[ENGINE_KEY], request.app[STATE_KEY]
    body = await read_json(request)
    check_model(state, body)
    messages = parse_messages(body)
    tokenizer = engine.engine.tokenizer
    if tokenizer is None or not tokenizer.chat_template:
        raise APIError("this model has no chat template; use /v1/completions")
    n_chars = sum(len(m["content"]) for m in messages)  # the rendered prompt has more
    try:
        encode = functools.partial(tokenizer.encode_chat, messages)
        max_len = engine.engine.max_model_len
        ids = await tokenize(tokenizer, n_chars, encode, max_len, "messages")
    except APIError:
        raise
    except Exception as e:
        raise APIError(f"the chat template failed on these messages: {e}", param="messages") from e
    parsed = parse_common(body, [ids], chat=True)
    if not parsed.max_tokens_given:  # like vLLM: whatever the context (and KV pool) leaves
        kv = engine.engine.kv
        room = min(engine.engine.max_model_len, kv.num_blocks * kv.block_size) - len(ids)
        parsed.params.max_tokens = max(1, room)
    return await serve(request, parsed, chat=True)


async def tokenize(
    tokenizer: Tokenizer,
    n_chars: int,
    encode: Callable[[], list[int]],
    max_len: int,
    param: str,
) -> list[int]:
    """A prompt's token ids without stalling every other stream: one that cannot fit the
    context is refused before it is tokenized (a few MB take the tokenizer seconds), and a
    long one is tokenized on a worker thread (the tokenizer releases the GIL for it)."""
    at_least = tokenizer.min_num_tokens(n_chars)
    if at_least >= max_len:
        raise APIError(
            f"this model's maximum context length is {max_len} tokens; the prompt has "
            f"{n_chars} characters, which is at least {at_least} tokens",
            param=param,
            code="context_length_exceeded",
        )
    if n_chars < LONG_TEXT_CHARS:
        return encode()
    return await asyncio.to_thread(encode)


async def serve(request: web.Request, parsed: ParsedRequest, chat: bool) -> web.StreamResponse:
    engine, state = request.app[ENGINE_KEY], request.app[STATE_KEY]
    max_len = engine.engine.max_model_len
    streams = []
    base_id = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
    tokenizer = engine.engine.tokenizer
    n = parsed.params.n
    check_logit_bias(parsed.params, engine.engine.model_config.vocab_size)
    check_capacity(request, len(parsed.prompts), n)  # before tokenizing, and again after
    prompts: list[list[int]] = []
    for prompt in parsed.prompts:  # validate every prompt before queueing any
        if isinstance(prompt, str):
            if tokenizer is None:
                raise APIError("this model has no tokenizer: send token ids", param="prompt")
            encode = functools.partial(tokenizer.encode, prompt)
            prompt = await tokenize(tokenizer, len(prompt), encode, max_len, "prompt")
        if len(prompt) + parsed.params.max_tokens > max_len:
            raise_context(len(prompt), parsed.params.max_tokens, max_len)
        prompts.append(prompt)
    check_capacity(request, len(prompts), n)  # no await from here until they are queued
    for i, ids in enumerate(prompts):
        try:
            stream = engine.generate(f"{base_id}-{i}", ids, parsed.params, parsed.priority)
            streams.append(stream)
        except ValueError as e:
            for s in streams:  # the earlier prompts of this request were queued: take them back
                await s.aclose()
            raise APIError(str(e), param="prompt") from e
    state.requests_total += len(streams)
    meta = {"id": base_id, "created": int(time.time()), "model": state.model_name}
    try:
        if parsed.stream:
            return await stream_response(
                request, streams, parsed.include_usage, chat, meta, state.ttft_s, parsed.params.n
            )
        return await full_response(streams, chat, meta, parsed.params.n)
    except asyncio.CancelledError:  # handler_cancellation: the client left
        log.info("client of %s left; its request was aborted", base_id)
        raise
    finally:  # finished streams: nothing; any an answer left behind (a client gone): aborted
        for s in streams:
            await s.aclose()


def raise_context(n_prompt: int, max_tokens: int, max_len: int) -> None:
    raise APIError(
        f"this model's maximum context length is {max_len} tokens; the request asks for "
        f"{n_prompt + max_tokens} ({n_prompt} in the prompt, {max_tokens} to generate)",
        param="prompt" if n_prompt >= max_len else "max_tokens",
        code="context_length_exceeded",
    )
