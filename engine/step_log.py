"""The step log (`bench serve --step-log`, `LLMEngine.log_steps`): one JSON line per engine
step, appended as the step ends, kept out of `LLMEngine.step` so the loop reads as the loop.
The simulated engine writes the same lines for the steps it models (engine/sim)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from engine.config import EngineConfig, ModelConfig
from engine.core.scheduler import SchedulerOutput
from engine.model.cost import StepShape, chunk_totals, step_cost_of_totals
from engine.model_store import DTYPES

if TYPE_CHECKING:
    from engine.engine import LLMEngine

Chunks = list[tuple[int, int]]  # (tokens computed before, tokens computed now) a request


class StepLog:
    """Appends a line per step to a file: when the step started on the perf_counter clock
    (shared by processes on one machine; virtual when simulated), how long it took, what it
    computed and the KV it read, the queues, KV blocks and KV tokens after it, and the queueing
    delays of the requests it started. A few microseconds a step."""

    def __init__(self, path: str | Path, config: EngineConfig, model: ModelConfig) -> None:
        self.file = open(path, "a", buffering=1)  # noqa: SIM115 (closed by close())
        self.config, self.model = config, model

    def close(self) -> None:
        self.file.close()

    @staticmethod
    def scheduled(out: SchedulerOutput) -> tuple[Chunks, StepShape]:
        """What the step computes, read before `Scheduler.advance` moves the requests on."""
        return [(r.num_computed_tokens, n) for r, n in out.scheduled], out.shape()

    def stepped(
        self,
        engine: LLMEngine,
        out: SchedulerOutput,
        t0: float,
        dur: float,
        before: tuple[Chunks, StepShape],
        sampled_rows: int,
        rejected: dict[str, int] | None,
        allreduce_s: float,
    ) -> None:
        """The line of a step `LLMEngine.step` ran (`before`: `scheduled(out)`)."""
        chunks, shape = before
        # Engine-side queueing of the requests first scheduled in this step.
        queue_s = [
            r.metrics.first_scheduled_time - r.metrics.arrival_time for r in out.first_scheduled
        ]
        drafts = sum(out.num_spec.values())
        self.write(
            engine,
            t0,
            dur,
            shape,
            sum(r.num_computed_tokens for r in engine.scheduler.running),
            self.cost(chunks, sampled_rows),
            preempted=len(out.preempted),
            cached_tokens=out.cached_tokens,
            queue_s=queue_s,
            draft_tokens=drafts,
            accepted_tokens=drafts - sum((rejected or {}).values()),
            allreduce_s=allreduce_s,
        )

    def write(
        self,
        engine: LLMEngine,
        t0: float,
        dur: float,
        shape: StepShape,
        kv_tokens: int,
        cost: dict[str, float],
        *,
        preempted: int = 0,
        cached_tokens: int = 0,
        queue_s: list[float] | None = None,
        draft_tokens: int = 0,
        accepted_tokens: int = 0,
        allreduce_s: float = 0.0,
    ) -> None:
        """One step log line, after the step: the queues and KV as it left them."""
        line = {
            "t": t0,  # start, s on perf_counter's clock (virtual when simulated)
            "dur_s": dur,  # the step's time, s
            **shape.as_dict(),  # prefill/decode tokens, seqs, context, ... (cost.py)
            "running": len(engine.scheduler.running),  # requests in the batch after the step
            "waiting": engine.num_waiting,  # added and not running (preempted ones included)
            "kv_blocks_used": engine.kv.num_used_blocks,
            "preempted": preempted,  # requests preempted in this step (recomputed later)
            "cached_tokens": cached_tokens,  # admitted from the prefix cache, not computed
            "prefix_cache_hit_rate": engine.kv.prefix_hit_rate,  # cached / queried tokens so far
            # KV stored for the running batch: computed tokens summed over requests, so
            # blocks shared (n > 1 siblings' prompt, prefix-cache hits) count once per user
            # and can push kv_tokens past kv_blocks_used * block_size.
            "kv_tokens": kv_tokens,
            "queue_s": queue_s or [],  # arrival-to-first-schedule of each request it started
            # Speculative decoding: draft tokens verified, and of those accepted.
            "draft_tokens": draft_tokens,
            "accepted_tokens": accepted_tokens,  # of draft_tokens
            # Tensor parallelism: rank 0's time in all-reduces during the step.
            "allreduce_s": allreduce_s,
            # Model FLOPs and bytes moved (engine/model/cost.py): utilization per step.
            **cost,
        }
        self.file.write(json.dumps(line) + "\n")

    def cost(self, chunks: Chunks, sampled_rows: int) -> dict[str, float]:
        return self.cost_of_totals(*chunk_totals(chunks), sampled_rows)

    def cost_of_totals(
        self, tokens: int, pairs: int, keys: int, sampled_rows: int
    ) -> dict[str, float]:
        """The step log's FLOPs and bytes (cost.step_cost_of_totals) at the engine's dtypes."""
        c = self.config
        dtype_bytes = DTYPES[c.dtype].itemsize
        cost = step_cost_of_totals(
            self.model,
            tokens,
            pairs,
            keys,
            sampled_rows,
            weight_bytes_per_param=1.0 if c.quantization == "fp8" else dtype_bytes,
            kv_bytes_per_elem=DTYPES[c.cache.kv_cache_dtype].itemsize,
            head_bytes_per_param=dtype_bytes,
        )
        return {
            "flops": cost.flops,
            "weight_bytes": cost.weight_bytes,
            "kv_read_bytes": cost.kv_read_bytes,
            "kv_write_bytes": cost.kv_write_bytes,
        }
