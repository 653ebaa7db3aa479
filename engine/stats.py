"""`LLMEngine.stats()`: the engine's gauges and counters in one flat dict, read by the
server's /metrics page (engine/serving/info_routes.py), the async engine's snapshot and
`bench run`'s telemetry. Kept out of engine.py so the engine reads as its loop."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from engine.model_store import DTYPES

if TYPE_CHECKING:
    from engine.engine import LLMEngine


def engine_stats(engine: LLMEngine) -> dict[str, Any]:
    """What the engine holds and has done so far: its queues, KV blocks and bytes, prefix
    cache, counters, the last step's size and time, speculation and tensor parallelism."""
    config, kv = engine.config, engine.kv
    counters, last_step = engine._counters, engine._last_step
    block_bytes = config.cache.block_size * engine.model_config.kv_bytes_per_token(
        DTYPES[config.cache.kv_cache_dtype].itemsize
    )
    token_bytes = block_bytes // config.cache.block_size
    tp = engine.runner.tp
    return {
        "num_running": len(engine.scheduler.running),
        "num_waiting": engine.num_waiting,
        "num_preemptions": engine.scheduler.num_preemptions,
        "kv_blocks_used": kv.num_used_blocks,
        "kv_blocks_total": kv.num_blocks,
        "kv_block_size": config.cache.block_size,
        "kv_block_bytes": block_bytes,
        "kv_peak_blocks_used": kv.peak_blocks_used,
        "kv_peak_bytes_used": kv.peak_blocks_used * block_bytes,
        # What the same peak concurrency would reserve with one max-length slab per request.
        "kv_contiguous_bytes_equivalent": kv.peak_num_requests * engine.max_model_len * token_bytes,
        "prefix_cache_queries": kv.prefix_queries,
        "prefix_cache_hits": kv.prefix_hits,
        "prefix_cache_hit_rate": kv.prefix_hit_rate,  # cached / queried tokens so far
        "kv_blocks_cached": len(kv.pool.cached),
        # Block copies that sharing saves now and at most (siblings, cache hits): those
        # held + these = what requests not sharing would hold.
        "kv_blocks_shared": kv.pool.num_shared_refs,
        "kv_peak_blocks_shared": kv.peak_blocks_shared,
        "prompt_tokens_computed": counters["prompt_tokens_computed"],
        "last_step_num_tokens": last_step["num_tokens"],
        "last_step_num_seqs": last_step["num_seqs"],
        "last_step_time_s": last_step["time_s"],
        "num_steps": counters["steps"],
        "prompt_tokens_total": counters["prompt_tokens"],
        "generation_tokens_total": counters["generation_tokens"],
        **engine.spec_stats(),
        "tensor_parallel_size": config.tensor_parallel_size,
        "tp_allreduce_seconds_total": tp.allreduce_s if tp else 0.0,
        "tp_allreduces_total": tp.num_allreduces if tp else 0,
    }
