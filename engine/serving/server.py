"""The OpenAI-compatible HTTP server for the engine (aiohttp): the app, its routes and its
start and stop. The handlers are completions.py's (/v1/completions, /v1/chat/completions)
and info_routes.py's (/v1/models, /health, /version, /v1/engine/config, /metrics); the API
key and the body limits are guard.py's."""

from __future__ import annotations

import json
import logging
import time

from aiohttp import web

from engine.serving.access_log import QUIET_PATHS, quiet_access_logger
from engine.serving.app_state import ENGINE_KEY, STATE_KEY, ServerState
from engine.serving.async_engine import AsyncLLMEngine
from engine.serving.completions import chat_completions, completions
from engine.serving.guard import (
    GUARD_KEY,
    ClientFaults,
    errors_and_auth,
    make_guard,
    raise_fd_limit,
)
from engine.serving.info_routes import engine_config, health, metrics, models, version
from engine.serving.limits import ServerLimits
from engine.serving.metrics import Histogram


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
