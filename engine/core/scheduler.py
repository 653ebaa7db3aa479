"""Iteration-level scheduling: each step spends a token budget on running requests first
(one decode token, or the next prefill chunk), then admits waiting ones while the budget,
`max_num_seqs` and free KV blocks allow.

`static` batching admits a new batch only once every request of the previous one has
finished: the baseline that continuous batching is compared against.

Policies (vLLM's names): `fcfs` admits in arrival order and, when the KV pool runs out,
preempts the most recently admitted request. `priority` admits in (priority, arrival) order,
preempts the lowest-priority, latest-arrived running request, and lets a waiting request of
higher priority preempt a running one of lower priority when no block or seat is free.
The waiting queues (request_queue.py) take O(log n) an operation under either policy."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from engine.config import SchedulerConfig
from engine.core.kv_cache_manager import KVCacheManager
from engine.core.request import FinishReason, Request, RequestStatus
from engine.core.request_queue import RequestQueue
from engine.model.cost import StepShape, step_shape


@dataclass(slots=True)
class SchedulerOutput:
    scheduled: list[tuple[Request, int]] = field(default_factory=list)  # (request, new tokens)
    preempted: list[Request] = field(default_factory=list)
    cached_tokens: int = 0  # admitted from the prefix cache this step (not computed)
    first_scheduled: list[Request] = field(default_factory=list)  # scheduled for the first time
    # Speculative decoding: draft tokens granted to a decode (request id -> count), included
    # in its scheduled tokens (1 + drafts).
    num_spec: dict[str, int] = field(default_factory=dict)
    _shape: StepShape | None = None  # shape(), once computed

    num_batched_tokens: int = 0  # the scheduled tokens' sum (kept by `add`, `drop`)

    def add(self, req: Request, n: int) -> None:
        self.scheduled.append((req, n))
        self.num_batched_tokens += n

    def drop(self, req: Request) -> None:
        """Take back what a preempted request was given this step."""
        self.scheduled = [(r, n) for r, n in self.scheduled if r is not req]
        self.num_batched_tokens = sum(n for _, n in self.scheduled)

    @property
    def is_empty(self) -> bool:
        return not self.scheduled

    def shape(self) -> StepShape:
        """What this step computes, for its cost (call before `Scheduler.advance`)."""
        if self._shape is not None:
            return self._shape
        chunks = []
        for r, n in self.scheduled:
            s, drafts = r.num_computed_tokens, len(r.spec_token_ids)
            rows = 1 + drafts if s + n - drafts == r.num_tokens else 0
            chunks.append((s, n, s == r.num_tokens - 1, rows))
        self._shape = step_shape(chunks)
        return self._shape


class Scheduler:
    def __init__(self, config: SchedulerConfig, kv: KVCacheManager, max_model_len: int) -> None:
        assert config.max_num_batched_tokens is not None, "resolve the config first"
        self.config = config
        self.kv = kv
        self.max_model_len = max_model_len
        self.by_priority = config.scheduling_policy == "priority"
        order = self.key if self.by_priority else None
        self.waiting = RequestQueue(order)
        self.running: list[Request] = []
        # Static batching: members of the current batch that are not running yet.
        self.batch_waiting = RequestQueue(order)
        self.num_preemptions = 0
        self._seq = itertools.count()  # arrival order among equal arrival times
        # Requests' engine timestamps (first scheduled, finished): wall clock, or the
        # simulated engine's virtual one (engine/sim).
        self.clock: Callable[[], float] = time.monotonic

    # ---- queue state -------------------------------------------------------------------

    @property
    def num_waiting(self) -> int:
        """The one definition of waiting (stats, the step log, /metrics): added and not in the
        running batch, preempted ones and a static batch's not-yet-running members included."""
        return len(self.waiting) + len(self.batch_waiting)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.batch_waiting or self.running)

    def check_fits(self, num_prompt_tokens: int, max_tokens: int) -> None:
        """Raise ValueError for a request that could never be scheduled."""
        budget = self.config.max_num_batched_tokens
        if num_prompt_tokens >= self.max_model_len:
            raise ValueError(
                f"prompt has {num_prompt_tokens} tokens; the context length is "
                f"{self.max_model_len}, which leaves no room to generate"
            )
        if not self.config.enable_chunked_prefill and num_prompt_tokens > budget:
            raise ValueError(
                f"prompt has {num_prompt_tokens} tokens, more than max_num_batched_tokens="
                f"{budget}; enable chunked prefill or raise the budget"
            )
        reserved = self.kv.blocks_for(self.kv.reserve_tokens)  # 0 unless kv_reservation=max_len
        if reserved > self.kv.num_blocks:
            raise ValueError(
                f"kv_reservation=max_len reserves {reserved} KV blocks a request (a "
                f"{self.kv.reserve_tokens}-token context); the cache has {self.kv.num_blocks}: "
                "no request can fit; lower max_model_len or raise num_kv_blocks"
            )
        worst = min(num_prompt_tokens + max_tokens, self.max_model_len)
        if self.kv.blocks_for(worst) > self.kv.num_blocks:
            raise ValueError(
                f"a request of {worst} tokens needs {self.kv.blocks_for(worst)} KV blocks; the "
                f"cache has {self.kv.num_blocks}: it can never fit"
            )

    def add(self, req: Request, front: bool = False) -> None:
        """Queue a request; `front`: it arrived before everything waiting (a held-back
        sibling of a parallel-sampling request)."""
        if req.arrival_seq is None:
            req.arrival_seq = next(self._seq)
        self.waiting.add(req, front)  # under `priority`, by its key: `front` is moot

    def key(self, req: Request) -> tuple[int, float, int]:
        """Service order under `priority`: lower priority value, then earlier arrival."""
        return (req.priority, req.metrics.arrival_time, req.arrival_seq or 0)

    # ---- one step ----------------------------------------------------------------------

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        total = self.config.max_num_batched_tokens
        assert total is not None

        for req in list(self.running):
            budget = total - out.num_batched_tokens
            if budget <= 0:
                break
            if req.status != RequestStatus.RUNNING:
                continue  # preempted this step to make room for another
            n = self._num_new_tokens(req, budget)
            spec = self._spec_tokens(req, n, budget)
            if n > 0 and (spec or self._allocate_or_preempt(req, n, out)):
                out.add(req, n + spec)
                if spec > 0:
                    out.num_spec[req.request_id] = spec

        if out.preempted and not self.by_priority:  # short of blocks: admitting would thrash
            return out
        self.admit(out)
        return out

    def admit(self, out: SchedulerOutput) -> None:
        """Admit waiting requests into what is left of the step's token budget (after the
        running requests took theirs), in service order, while seats and blocks allow."""
        total = self.config.max_num_batched_tokens
        assert total is not None
        queue = self._admission_queue()
        while queue and (budget := total - out.num_batched_tokens) > 0:
            req = queue.peek()
            if req in out.preempted:  # the best waiting one could not stay: no room now
                break
            full = len(self.running) >= self.config.max_num_seqs
            result = "no seat" if full else self._admit(req, budget, out)
            if result == "admitted":
                queue.pop()
            elif result == "no budget" or not self._preempt_for(req, out):
                break

    def _spec_tokens(self, req: Request, n: int, budget: int) -> int:
        """Draft tokens a decode verifies this step (0, or what it wanted that the budget
        allows), their KV slots allocated with its token's: drafts never preempt anyone."""
        spec = min(req.num_spec_wanted, budget - n) if n == 1 else 0
        if spec > 0 and self.kv.allocate_slots(req.request_id, req.num_computed_tokens + 1 + spec):
            return spec
        return 0

    def _preempt_for(self, req: Request, out: SchedulerOutput) -> bool:
        """Under `priority` (continuous batching), make room for a waiting request by
        preempting the worst running one, if it is worse than `req`."""
        if not self.by_priority or self.config.batching != "continuous" or not self.running:
            return False
        victim = max(self.running, key=self.key)
        if self.key(victim) <= self.key(req):
            return False
        self._preempt(victim, out)
        return True

    def _admit(self, req: Request, budget: int, out: SchedulerOutput) -> str:
        """Start (or restart, after preemption) a waiting request: from its longest cached
        prefix, then as many new tokens as the budget allows. "admitted", or why not: "no
        budget" (this step's tokens are spent) or "no blocks"."""
        hit = self.kv.computed_blocks(req.request_id, req.token_ids)
        req.num_computed_tokens = len(hit) * self.kv.block_size
        n = self._num_new_tokens(req, budget)
        if n == 0:
            req.num_computed_tokens = 0
            return "no budget"
        if not self.kv.allocate_slots(req.request_id, req.num_computed_tokens + n, hit):
            req.num_computed_tokens = 0
            return "no blocks"
        self.kv.record_lookup(req.num_tokens, req.num_computed_tokens)
        if req.num_cached_tokens is None:  # the first admission's hit is what usage reports
            req.num_cached_tokens = req.num_computed_tokens
        out.cached_tokens += req.num_computed_tokens
        req.status = RequestStatus.RUNNING
        if req.metrics.first_scheduled_time is None:
            req.metrics.first_scheduled_time = self.clock()
            out.first_scheduled.append(req)
        self.running.append(req)
        out.add(req, n)
        return "admitted"

    def _num_new_tokens(self, req: Request, budget: int) -> int:
        n = req.num_tokens - req.num_computed_tokens
        threshold = self.config.long_prefill_token_threshold
        if self.config.enable_chunked_prefill and 0 < threshold < n:
            n = threshold
        if n <= budget:
            return n
        full_budget = self.config.max_num_batched_tokens
        assert full_budget is not None
        if self.config.enable_chunked_prefill or n > full_budget:
            # Without chunked prefill only a recompute after preemption can exceed the whole
            # budget (prompts that do are rejected on arrival); it is chunked to make progress.
            return budget
        return 0  # the whole prompt waits for a step with room for all of it

    def _allocate_or_preempt(self, req: Request, n: int, out: SchedulerOutput) -> bool:
        """Allocate blocks for `n` more tokens of a running request, preempting victims
        (fcfs: the most recently admitted; priority: the worst) until it fits. False if
        `req` itself was preempted."""
        while not self.kv.allocate_slots(req.request_id, req.num_computed_tokens + n):
            victim = max(self.running, key=self.key) if self.by_priority else self.running[-1]
            self._preempt(victim, out)
            if victim is req:
                return False
        return True

    def _preempt(self, req: Request, out: SchedulerOutput) -> None:
        """Back to the queue, to be recomputed; tokens it was given this step are taken back."""
        self.running.remove(req)
        out.drop(req)
        out.num_spec.pop(req.request_id, None)
        out.preempted.append(req)
        self.kv.free(req.request_id)
        req.num_computed_tokens = 0  # recompute from scratch when readmitted
        req.status = RequestStatus.PREEMPTED
        req.metrics.num_preemptions += 1
        self.num_preemptions += 1
        queue = self.batch_waiting if self.config.batching == "static" else self.waiting
        queue.add(req, front=True)  # fcfs: ahead of all; priority: by its key

    def _admission_queue(self) -> RequestQueue:
        if self.config.batching == "continuous":
            return self.waiting
        if not self.running and not self.batch_waiting:  # waiting is in service order
            for _ in range(min(self.config.max_num_seqs, len(self.waiting))):
                self.batch_waiting.add(self.waiting.pop())
        return self.batch_waiting

    # ---- after a step ------------------------------------------------------------------

    def advance(self, out: SchedulerOutput, rejected: dict[str, int] | None = None) -> None:
        """Count the step's tokens as computed; `rejected`: draft tokens (request id -> count)
        the target did not accept, whose KV slots are rolled back (whole blocks freed)."""
        for req, n in out.scheduled:
            back = rejected.get(req.request_id, 0) if rejected else 0
            req.num_computed_tokens += n - back
            if back:  # the next step writes the KV of the token just sampled
                self.kv.trim(req.request_id, req.num_computed_tokens + 1)
            # Accepted drafts are computed tokens not yet appended to token_ids.
            tokens = req.token_ids + req.spec_token_ids if req.spec_token_ids else req.token_ids
            self.kv.cache_computed(req.request_id, tokens, req.num_computed_tokens)

    def finish(self, req: Request, reason: FinishReason) -> None:
        if req.status == RequestStatus.RUNNING:
            self.running.remove(req)
        elif not self.batch_waiting.remove(req):
            self.waiting.remove(req)
        self.kv.free(req.request_id)
        req.status = RequestStatus.FINISHED
        req.finish_reason = reason
        req.metrics.finish_time = self.clock()
