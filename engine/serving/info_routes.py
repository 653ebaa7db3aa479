"""The server's read-only routes: /health, /version, /v1/models, /v1/engine/config (what
a benchmark records of the server) and /metrics (the engine's gauges, counters and
histograms as Prometheus text)."""

from __future__ import annotations

from dataclasses import asdict

from aiohttp import web

from engine.serving.app_state import ENGINE_KEY, STATE_KEY
from engine.serving.guard import GUARD_KEY
from engine.serving.metrics import render_page


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
            "cpu_threads": engine.cpu_threads,
            "cpu_pool_threads": engine.cpu_pool_threads,
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
