"""The OpenAI-compatible HTTP server for the engine (aiohttp): routes, admission and request
handlers for /v1/completions and /v1/chat/completions (SSE streaming or not, with usage),
/v1/models, /health, /v1/engine/config and /metrics. The API key and the body limits are
guard.py's.

Bad input never reaches the engine: it is answered 4xx with an OpenAI-style error body."""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from aiohttp import web

from engine.model.tokenizer import LONG_TEXT_CHARS, Tokenizer
from engine.serving.access_log import QUIET_PATHS, quiet_access_logger
from engine.serving.async_engine import AsyncLLMEngine
from engine.serving.guard import (
    GUARD_KEY,
    ClientFaults,
    errors_and_auth,
    make_guard,
    raise_fd_limit,
    read_json,
)
from engine.serving.limits import ServerLimits
from engine.serving.metrics import Histogram, render_page
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


ENGINE_KEY = web.AppKey("engine", AsyncLLMEngine)
STATE_KEY = web.AppKey("state", "ServerState")


@dataclass
class ServerState:
    model_name: str
    max_queue: int
    started_at: float
    config: dict[str, Any]
    ttft_s: Histogram
    requests_total: int = 0
    rejected_total: int = 0
    queue_time_s: Histogram = field(default_factory=Histogram)  # observed by the engine thread


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


async def health(request: web.Request) -> web.Response:
    """200 once the engine is ready (what `bench run` waits for); no API key needed."""
    return web.json_response({"status": "ok"})


async def version(request: web.Request) -> web.Response:
    """The package's version, at vLLM's path for it: what a benchmark records of a server."""
    import importlib.metadata

    try:
        return web.json_response({"version": importlib.metadata.version("servebench")})
    except importlib.metadata.PackageNotFoundError:
        return web.json_response({"version": "unknown"})


async def engine_config(request: web.Request) -> web.Response:
    """The engine's whole resolved config (a servebench extension): what a benchmark records."""
    engine = request.app[ENGINE_KEY].engine
    return web.json_response(
        {
            "model_name": request.app[STATE_KEY].model_name,
            "engine": engine.config.to_dict(),
            "memory": {
                "weight_bytes": engine.weight_bytes,
                "weight_bytes_bf16": engine.weight_bytes_bf16,
                "kv_cache_bytes": engine.stats()["kv_block_bytes"] * engine.kv.num_blocks,
            },
            "decode_attention": engine.decode_attention,
            "model_forward": engine.model_forward,
            "linears": engine.linears,
            "model_shape": asdict(engine.model_config),  # for FLOP counts
        }
    )


async def models(request: web.Request) -> web.Response:
    """The one served model (`--served-model-name`, else the model's name), as OpenAI lists."""
    engine, state = request.app[ENGINE_KEY], request.app[STATE_KEY]
    return web.json_response(
        {
            "object": "list",
            "data": [
                {
                    "id": state.model_name,
                    "object": "model",
                    "created": int(state.started_at),
                    "owned_by": "servebench",
                    "max_model_len": engine.engine.max_model_len,
                }
            ],
        }
    )


async def metrics(request: web.Request) -> web.Response:
    """Prometheus text: the engine's gauges, counters and histograms (docs/reference)."""
    engine, state = request.app[ENGINE_KEY], request.app[STATE_KEY]
    s = engine.stats
    per_pos = s["spec_decode_num_accepted_tokens_per_pos"]
    gauges = {
        "num_requests_running": ("gauge", s["num_running"], "requests in the running batch"),
        "num_requests_waiting": ("gauge", s["num_waiting"], "requests queued, not running"),
        "kv_blocks_used": ("gauge", s["kv_blocks_used"], "KV-cache blocks in use"),
        "kv_peak_blocks_used": ("gauge", s["kv_peak_blocks_used"], "most KV blocks ever in use"),
        "kv_blocks_total": ("gauge", s["kv_blocks_total"], "KV-cache blocks in the pool"),
        "num_preemptions_total": ("counter", s["num_preemptions"], "preemptions (recompute)"),
        "prompt_tokens_total": ("counter", s["prompt_tokens_total"], "prompt tokens prefilled"),
        "generation_tokens_total": ("counter", s["generation_tokens_total"], "tokens generated"),
        # vLLM v1's names: prompt tokens looked up in the prefix cache, and of those, found
        "prefix_cache_queries_total": (
            "counter",
            s["prefix_cache_queries"],
            "prompt tokens looked up in the prefix cache",
        ),
        "prefix_cache_hits_total": (
            "counter",
            s["prefix_cache_hits"],
            "prompt tokens found in the prefix cache",
        ),
        "kv_blocks_cached": ("gauge", s["kv_blocks_cached"], "KV blocks findable by hash"),
        # vLLM's spec-decode counters: verified drafts (a request's proposals in one step),
        # draft tokens, accepted ones, and accepted ones by draft position.
        "spec_decode_num_drafts_total": (
            "counter",
            s["spec_decode_num_drafts"],
            "speculative drafts verified",
        ),
        "spec_decode_num_draft_tokens_total": (
            "counter",
            s["spec_decode_num_draft_tokens"],
            "draft tokens verified",
        ),
        "spec_decode_num_accepted_tokens_total": (
            "counter",
            s["spec_decode_num_accepted_tokens"],
            "draft tokens accepted",
        ),
        # Ours: decoding requests asked for a draft, and those the proposer found one for.
        "spec_decode_num_lookups_total": (
            "counter",
            s["spec_decode_num_lookups"],
            "decoding requests the proposer was asked for a draft",
        ),
        "spec_decode_num_proposals_total": (
            "counter",
            s["spec_decode_num_proposals"],
            "of those, the ones it proposed a draft for",
        ),
        "spec_decode_num_accepted_tokens_per_pos_total": (
            "counter",
            {f'position="{i}"': n for i, n in enumerate(per_pos)},
            "draft tokens accepted, by position in the draft",
        ),
        "tp_allreduce_seconds_total": (
            "counter",
            s["tp_allreduce_seconds_total"],
            "tensor parallelism: rank 0's time in all-reduces",
        ),
        "requests_total": ("counter", state.requests_total, "requests accepted"),
        "requests_rejected_total": (
            "counter",
            state.rejected_total,
            "requests refused: queue full",
        ),
        "requests_refused_by_limits_total": (
            "counter",
            request.app[GUARD_KEY].refused_total,
            "requests refused by the HTTP limits: body too large (413), too slow (408), "
            "too many bodies being received (503)",
        ),
        "server_start_time_seconds": ("gauge", state.started_at, "unix time the server started"),
    }
    histograms = {
        "step_time_seconds": (engine.step_time_s, "time of one engine step"),
        "time_to_first_token_seconds": (state.ttft_s, "streamed requests' TTFT"),
        "request_queue_time_seconds": (
            state.queue_time_s,
            "time from arrival to first being scheduled, per completion",
        ),
    }
    text = render_page(gauges, histograms, state.config)
    return web.Response(text=text, content_type="text/plain")


def build_app(
    engine: AsyncLLMEngine,
    model_name: str,
    api_key: str | None = None,
    max_queue: int = 256,
    limits: ServerLimits | None = None,
) -> web.Application:
    """The app; an empty `api_key` is refused (ValueError): it would be an open server."""
    limits = limits or ServerLimits()
    guard = make_guard(api_key, limits)
    app = web.Application(middlewares=[errors_and_auth], client_max_size=limits.max_body_bytes)
    app[GUARD_KEY] = guard
    cfg = engine.engine.config
    flat = {"model": cfg.model} | cfg.flat()  # every setting, as its label
    flat["quantization"] = cfg.quantization or "none"
    flat["speculative_config"] = json.dumps(cfg.to_dict()["speculative_config"])
    if engine.engine.tokenizer is not None:
        _ = engine.engine.tokenizer.max_token_chars  # computed once now, not on the event loop
    app[ENGINE_KEY] = engine
    state = ServerState(model_name, max_queue, time.time(), flat, Histogram())
    engine.engine.on_queue_time = state.queue_time_s.observe
    app[STATE_KEY] = state
    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/health", health)
    app.router.add_get("/version", version)
    app.router.add_get("/v1/engine/config", engine_config)
    app.router.add_get("/metrics", metrics)

    async def on_startup(app: web.Application) -> None:
        await engine.start()

    async def on_shutdown(app: web.Application) -> None:
        await engine.stop()

    app.on_startup.append(on_startup)
    app.on_shutdown.append(on_shutdown)
    return app


def run(
    app: web.Application, host: str, port: int, quiet_paths: tuple[str, ...] = QUIET_PATHS
) -> None:
    """Serve until SIGINT/SIGTERM. handler_cancellation: a client that leaves a non-streamed
    request aborts it too. lingering_time 0: a body the server refused or could not decode
    is not read on after the answer (a slow client would hold its socket 10 s more, and a
    bad gzip stream would fail again there); the connection closes instead."""
    raise_fd_limit()
    logging.getLogger("aiohttp.server").addFilter(ClientFaults())
    web.run_app(
        app,
        host=host,
        port=port,
        print=None,
        shutdown_timeout=10,
        handler_cancellation=True,
        lingering_time=0,
        backlog=2048,  # uvicorn's (and so vLLM's) default
        access_log_class=quiet_access_logger(quiet_paths),  # no /metrics, /health polls
    )
