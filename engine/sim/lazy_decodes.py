"""Decodes the simulation advances without visiting them. A running request that decodes one
token a step changes in only three steps of its life: when it needs a new KV block, when it
fills one (the prefix cache learns it) and when it takes its last token. Between those it is
a member of a group whose step counter stands for its progress, so a simulated step costs
its events (a few per ten running requests) and not a visit to every running request: the
speed of an hour of 100 req/s on a simulated H100 (~250 requests running, two finishing and
two arriving every step, so a decode-only stretch never lasts).

The rest of each step (prefill chunks, admissions from the queue, finishes, outputs) goes
through the scheduler's and the engine's own code. A step that would preempt anyone, or a
running batch the group cannot describe, returns None: the engine brings the members up to
date (`dissolve`) and takes a real step. tests/engine/sim/test_sim.py checks every step log line and
request record against stepping with the group off."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass
from operator import attrgetter
from typing import TYPE_CHECKING, Any

from engine.core.request import Request, RequestStatus
from engine.core.scheduler import SchedulerOutput
from engine.model.cost import StepShape, chunk_totals

if TYPE_CHECKING:
    from engine.sim.sim_engine import SimEngine


@dataclass(slots=True, eq=False)
class _Member:
    req: Request
    rank: int  # join order, which is the order of the scheduler's running list
    joined: int  # the group step of its first lazy token
    base: int  # the group step its num_computed_tokens and token_ids are exact at
    last: int  # the group step of its last token


_by_rank = attrgetter("rank")
_Events = dict[int, list[_Member]]


class LazyDecodes:
    """The group. `g` counts the steps it took; a member's true computed tokens are its
    `num_computed_tokens` + (g - base), its token_ids lack as many copies of the runner's
    token. `on_tokens(request, first, stop)` hears of the lazy tokens when a member leaves:
    one at the end of each group step first..stop-1 (`ends`)."""

    def __init__(self, engine: SimEngine) -> None:
        self.engine = engine
        self.g = 0
        self.ends: list[float] = []  # each group step's end time
        self.members: dict[str, _Member] = {}  # in join order
        self.context = 0  # the members' computed tokens at the start of step g, summed
        self.grows: _Events = {}  # step -> members that need a new block in it
        self.fills: _Events = {}  # step -> members whose block fills (prefix caching)
        self.finishes: _Events = {}  # step -> members that take their last token
        self.on_tokens: Callable[[Request, int, int], None] | None = None
        self._rank = itertools.count()

    # ---- membership --------------------------------------------------------------------

    def rebuild(self) -> None:
        """Let in the running requests that decode, from the front of the running list's
        non-members (members must stay ahead of every non-member in it)."""
        engine = self.engine
        if engine._held:
            return
        token = engine.runner.token_id  # type: ignore[attr-defined]
        for req in engine.scheduler.running[len(self.members) :]:
            if (
                req.status is not RequestStatus.RUNNING
                or req.num_computed_tokens != req.num_tokens - 1
                or not req.num_output_tokens  # a prompt one token short: its first is real
                or token in req.stop_token_ids
                or req.parent_id != req.request_id  # n > 1: records keep per-choice order
                or req.num_spec_wanted
            ):
                return
            self._join(req)

    def _join(self, req: Request) -> None:
        engine, g = self.engine, self.g
        kv, bs = engine.kv, engine.kv.block_size
        c = req.num_computed_tokens
        left = min(req.params.max_tokens - req.num_output_tokens, engine.max_model_len - c - 1)
        assert left > 0, req
        m = _Member(req, next(self._rank), g, g, g + left - 1)
        self.members[req.request_id] = m
        self.context += c
        self._at(self.grows, g + len(kv.block_tables[req.request_id]) * bs - c, m)
        if kv.enable_prefix_caching:
            self._at(self.fills, g + (bs - (c + 1) % bs) % bs, m)
        self._at(self.finishes, m.last, m)

    @staticmethod
    def _at(events: _Events, step: int, m: _Member) -> None:
        if step <= m.last:
            events.setdefault(step, []).append(m)

    def _materialize(self, m: _Member) -> None:
        """Bring the member's tokens and computed count to the start of step g."""
        k = self.g - m.base
        if k:
            req = m.req
            req.token_ids.extend(itertools.repeat(self.engine.runner.token_id, k))  # type: ignore[attr-defined]
            req.num_computed_tokens += k
            m.base = self.g

    def _leave(self, m: _Member) -> None:
        self._materialize(m)
        del self.members[m.req.request_id]
        self.context -= m.req.num_computed_tokens
        if self.on_tokens is not None and self.g > m.joined:
            self.on_tokens(m.req, m.joined, self.g)

    def dissolve(self) -> None:
        """Every member up to date and out of the group (before a real step, an abort)."""
        for m in list(self.members.values()):
            self._leave(m)
        self.grows.clear()
        self.fills.clear()
        self.finishes.clear()

    # ---- one step ----------------------------------------------------------------------

    def step(self) -> list[Any] | None:
        """What LLMEngine.step would do, and its outputs but the members' (their tokens go
        to `on_tokens` when they leave); None where a real step must run."""
        engine = self.engine
        sched, kv = engine.scheduler, engine.kv
        d, g = len(self.members), self.g
        total = sched.config.max_num_batched_tokens
        assert total is not None
        if not d or d > total or engine._held:
            return None
        others = sched.running[d:]
        if any(r.request_id in self.members for r in others):
            return None
        # The running non-members take their chunks as schedule() gives them, after the
        # members' one token each; nobody may need a block the pool does not have.
        budget, plan = total - d, []
        growers = self.grows.get(g, ())
        need = len(growers)
        for req in others:
            if budget <= 0:
                break
            n = sched._num_new_tokens(req, budget)
            if req.num_spec_wanted or req.status is not RequestStatus.RUNNING:
                return None
            if n > 0:
                have = len(kv.block_tables[req.request_id])
                need += max(0, kv.blocks_for(req.num_computed_tokens + n) - have)
                plan.append((req, n))
                budget -= n
        if need > kv.pool.num_free:
            return None

        if growers:
            del self.grows[g]
            growers = sorted(growers, key=_by_rank)
            kv.grow([m.req.request_id for m in growers])
            for m in growers:
                self._at(self.grows, g + kv.block_size, m)
        out = SchedulerOutput()
        for req, n in plan:
            kv.allocate_slots(req.request_id, req.num_computed_tokens + n)
            out.add(req, n)
        out.num_batched_tokens += d
        sched.admit(out)
        if engine.on_queue_time is not None:
            for r in out.first_scheduled:
                engine.on_queue_time(r.metrics.first_scheduled_time - r.metrics.arrival_time)

        t0 = engine._step_started()
        ctx, o = self.context, out.shape()
        shape = StepShape(
            o.prefill_tokens,
            o.decode_tokens + d,
            o.seqs + d,
            o.context_tokens + ctx + d,
            o.decode_context_tokens + ctx + d,
            o.prefill_attention_pairs,
            o.sampled_rows + d,
        )
        chunks = [(r.num_computed_tokens, n) for r, n in out.scheduled]
        engine._count_prompt_computed(out)  # members are past their prompts
        runner = engine.runner
        dur = runner.last_step_s = runner.step_model.step_time(shape)  # type: ignore[attr-defined]

        for m in sorted(self.fills.pop(g, ()), key=_by_rank):  # advance(), members first
            self._materialize(m)
            req = m.req
            kv.cache_computed(req.request_id, req.token_ids, req.num_computed_tokens + 1)
            self._at(self.fills, g + kv.block_size, m)
        sched.advance(out)

        now, token = sched.clock(), runner.token_id  # type: ignore[attr-defined]
        outputs: list[Any] = []
        finishing = sorted(self.finishes.pop(g, ()), key=_by_rank)
        for m in finishing:
            self._leave(m)
            m.req.num_computed_tokens += 1
            outputs.append(engine._emit(m.req, [token], now))
            assert m.req.is_finished, m.req
        rows = d
        for req, _ in out.scheduled:
            if req.num_computed_tokens == req.num_tokens:  # caught up: it samples
                outputs.append(engine._emit(req, [token], now))
                rows += 1
        self.context += d - len(finishing)  # each member left computed one more token

        counters = engine._counters
        counters["steps"] += 1
        counters["generation_tokens"] += rows
        n = out.num_batched_tokens
        engine._last_step = {"num_tokens": n, "num_seqs": d + len(out.scheduled), "time_s": dur}
        if (log := engine._step_log) is not None:
            tokens, pairs, keys = chunk_totals(chunks)
            kv_tokens = self.context + sum(
                r.num_computed_tokens for r in sched.running[len(self.members) :]
            )
            log.write(
                engine,
                t0,
                dur,
                shape,
                kv_tokens,
                log.cost_of_totals(tokens + d, pairs + ctx + d, keys + ctx + d, rows),
                cached_tokens=out.cached_tokens,
                queue_s=[
                    r.metrics.first_scheduled_time - r.metrics.arrival_time
                    for r in out.first_scheduled
                ],
            )
        self.ends.append(t0 + dur)
        self.g += 1
        self.rebuild()
        return outputs
