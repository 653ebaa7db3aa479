"""Stateful property test: a real `Scheduler` over a real `KVCacheManager` with the prefix
cache on or off, driven by random adds (prompts that share prefixes), steps, aborts, early
stops and cache resets, keeps its block accounting exact, never writes into a block another
request reads, never frees a block in use nor leaks one, keeps every cached block's contents
equal to its hash, and never deadlocks.

A step mimics `LLMEngine.step` without a model: schedule, "compute" (each block records the
tokens whose KV it now holds: the whole prefix up to its end, as real KV depends on it),
advance, then every scheduled request whose tokens are all computed gets one fake sampled
token and is finished (LENGTH) once it reached `max_tokens` or the context length."""

from __future__ import annotations

import itertools

import hypothesis.strategies as st
from hypothesis import HealthCheck, settings
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from engine.config import SchedulerConfig
from engine.core.kv_cache_manager import (
    BlockHasher,
    KVCacheManager,
    builtin_chain_hashes,
    chain_hashes,
    hash_block,
)
from engine.core.request import FinishReason, Request, RequestStatus, SamplingParams
from engine.core.scheduler import Scheduler

FAKE_TOKEN = 7
# Every step advances the oldest running request by at least one token and it is never
# preempted, so a drain needs at most about (tokens of all requests) x (1 + recomputes) steps;
# this bound is far above that for the sizes drawn here.
MAX_DRAIN_STEPS = 20_000


class SchedulerMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.ids = itertools.count()
        self.live: list[Request] = []  # in arrival order
        self.arrival: dict[str, int] = {}
        self.batch: set[str] = set()  # static batching: the ids of the current batch
        self.configured = False

    @initialize(
        num_blocks=st.integers(8, 40),
        block_size=st.sampled_from([4, 4, 16]),
        max_num_seqs=st.integers(1, 6),
        max_num_batched_tokens=st.integers(1, 96),
        enable_chunked_prefill=st.booleans(),
        long_prefill_token_threshold=st.sampled_from([0, 0, 3, 16]),
        batching=st.sampled_from(["continuous", "static"]),
        max_model_len=st.integers(8, 256),
        prefix_caching=st.booleans(),
        policy=st.sampled_from(["fcfs", "priority"]),
        hasher=st.sampled_from([chain_hashes, builtin_chain_hashes]),  # the engine's, the sim's
    )
    def configure(
        self,
        num_blocks: int,
        block_size: int,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        enable_chunked_prefill: bool,
        long_prefill_token_threshold: int,
        batching: str,
        max_model_len: int,
        prefix_caching: bool,
        policy: str,
        hasher: BlockHasher,
    ) -> None:
        self.config = SchedulerConfig(
            batching=batching,  # type: ignore[arg-type]
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens,
            enable_chunked_prefill=enable_chunked_prefill,
            long_prefill_token_threshold=long_prefill_token_threshold,
            scheduling_policy=policy,  # type: ignore[arg-type]
        )
        self.kv = KVCacheManager(num_blocks, block_size, prefix_caching, hasher=hasher)
        self.contents: dict[int, tuple[int, ...]] = {}  # block -> the prefix its KV holds
        self.max_model_len = max_model_len
        self.scheduler = Scheduler(self.config, self.kv, max_model_len)
        self.budget = max_num_batched_tokens
        self.configured = True

    # ---- helpers -----------------------------------------------------------------------

    def _step(self) -> None:
        """One engine iteration without a model; checks the per-step limits on the way."""
        sched = self.scheduler
        out = sched.schedule()
        assert out.num_batched_tokens <= self.budget
        assert all(n >= 1 for _, n in out.scheduled)
        scheduled_ids = [r.request_id for r, _ in out.scheduled]
        assert len(scheduled_ids) == len(set(scheduled_ids)), "a request scheduled twice"
        assert len(sched.running) <= self.config.max_num_seqs
        assert all(r.status == RequestStatus.RUNNING for r, _ in out.scheduled)
        assert not {r.request_id for r in out.preempted} & set(scheduled_ids)
        cfg = self.config
        whole_prompts = not cfg.enable_chunked_prefill and cfg.long_prefill_token_threshold == 0
        for req, n in out.scheduled:
            assert req.num_computed_tokens + n <= req.num_tokens
            if whole_prompts and req.num_computed_tokens == 0 and req.num_tokens <= self.budget:
                assert n == req.num_tokens, "a prompt was split without chunked prefill"
        if self.config.batching == "static":
            self._check_static_batch()
        self._compute(out)
        sched.advance(out)
        for req, _ in out.scheduled:
            if req.num_computed_tokens == req.num_tokens:
                req.token_ids.append(FAKE_TOKEN)
                if (
                    req.num_output_tokens >= req.params.max_tokens
                    or req.num_tokens >= self.max_model_len
                ):
                    self._finish(req, FinishReason.LENGTH)

    def _compute(self, out) -> None:
        """Write each scheduled token's KV into its block: only into a block this request
        alone holds (a shared block is read-only), and only over tokens that are the same or
        new (a block is never rewritten with other tokens while cached)."""
        bs, pool = self.kv.block_size, self.kv.pool
        for req, n in out.scheduled:
            table = self.kv.block_tables[req.request_id]
            for pos in range(req.num_computed_tokens, req.num_computed_tokens + n):
                block = table[pos // bs]
                assert pool.ref_counts[block] == 1, f"wrote into shared block {block}"
                self.contents[block] = tuple(req.token_ids[: pos + 1])
                if pos % bs == 0:  # a block's first write: it held another prefix before
                    assert pool.block_hash[block] is None, "wrote into a cached block"

    def _check_static_batch(self) -> None:
        """A new static batch starts only once every member of the previous one finished."""
        sched = self.scheduler
        members = {r.request_id for r in (*sched.running, *sched.batch_waiting)}
        if members - self.batch:
            live_ids = {r.request_id for r in self.live}
            assert not self.batch & live_ids, "a new batch started before the last one finished"
            assert not members & self.batch
            assert len(members) <= self.config.max_num_seqs
            self.batch = members

    def _finish(self, req: Request, reason: FinishReason) -> None:
        self.scheduler.finish(req, reason)
        self.live.remove(req)
        assert req.status == RequestStatus.FINISHED
        assert req.request_id not in self.kv.block_tables

    def _drain(self) -> None:
        for _ in range(MAX_DRAIN_STEPS):
            if not self.scheduler.has_unfinished():
                break
            self._step()
            self.check_block_accounting()
        assert not self.scheduler.has_unfinished(), f"deadlock: {self.live}"
        assert not self.live
        assert self.kv.pool.num_used == 0
        assert self.kv.pool.num_free == self.kv.num_blocks
        assert not self.kv.block_tables

    def _add(self, prompt_len: int, max_tokens: int) -> None:
        budget = self.budget
        worst = min(prompt_len + max_tokens, self.max_model_len)
        never_fits = (
            prompt_len >= self.max_model_len
            or (not self.config.enable_chunked_prefill and prompt_len > budget)
            or self.kv.blocks_for(worst) > self.kv.num_blocks
        )
        try:
            self.scheduler.check_fits(prompt_len, max_tokens)
        except ValueError:
            assert never_fits
            return
        assert not never_fits
        rid = f"r{next(self.ids)}"
        tokens = self._tokens(prompt_len)
        params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
        req = Request(rid, tokens, params, priority=len(self.arrival) * 5 % 3)
        self.arrival[rid] = len(self.arrival)
        self.live.append(req)
        self.scheduler.add(req)

    def _tokens(self, n: int) -> list[int]:
        """One of three shared "system prompts" cut at a random length, then its own tail:
        requests share prefixes of every length, aligned to blocks or not."""
        k = next(self.ids)
        shared = (k * 7919) % 3
        cut = (k * 104729) % (n + 1)
        return [100 + shared] * cut + [1000 + k + i for i in range(n - cut)]

    def _prompt_lengths(self) -> st.SearchStrategy[int]:
        # Up to the whole cache: small ones share it, large ones crowd each other out.
        capacity = self.kv.num_blocks * self.kv.block_size
        return st.one_of(st.integers(1, max(1, capacity // 4)), st.integers(1, capacity))

    # ---- rules -------------------------------------------------------------------------

    @rule(data=st.data(), max_tokens=st.integers(1, 64))
    def add_request(self, data: st.DataObject, max_tokens: int) -> None:
        self._add(data.draw(self._prompt_lengths(), label="prompt_len"), max_tokens)

    @rule(data=st.data(), max_tokens=st.lists(st.integers(1, 64), min_size=2, max_size=5))
    def add_several_requests(self, data: st.DataObject, max_tokens: list[int]) -> None:
        for n in max_tokens:
            self._add(data.draw(self._prompt_lengths(), label="prompt_len"), n)

    @rule()
    def step(self) -> None:
        self._step()

    @rule(n=st.integers(2, 12))
    def step_several_times(self, n: int) -> None:
        for _ in range(n):
            self._step()
            self.check_block_accounting()
            self.check_request_states()

    @precondition(lambda self: bool(self.live))
    @rule(data=st.data())
    def abort_request(self, data: st.DataObject) -> None:
        self._finish(data.draw(st.sampled_from(self.live)), FinishReason.ABORT)

    @precondition(lambda self: bool(self.scheduler.running))
    @rule(data=st.data())
    def stop_running_request_early(self, data: st.DataObject) -> None:
        self._finish(data.draw(st.sampled_from(self.scheduler.running)), FinishReason.STOP)

    @rule()
    def reset_prefix_cache(self) -> None:
        if self.configured:
            self.kv.reset_prefix_cache()

    @precondition(lambda self: len(self.live) >= 2)
    @rule()
    def drain_finishes_every_request(self) -> None:
        self._drain()

    # ---- invariants --------------------------------------------------------------------

    @invariant()
    def check_block_accounting(self) -> None:
        if not self.configured:
            return
        kv, pool = self.kv, self.kv.pool
        tables = kv.block_tables
        users: dict[int, int] = {}
        for table in tables.values():
            assert len(table) == len(set(table)), "a block twice in one table"
            for b in table:
                users[b] = users.get(b, 0) + 1
        if not kv.enable_prefix_caching:
            assert all(n == 1 for n in users.values()), "a block shared without caching"
        assert len(users) == pool.num_used
        for b in range(pool.num_blocks):
            assert pool.ref_counts[b] == users.get(b, 0), f"block {b}: reference count"
        free = pool.free_queue()
        assert len(free) == len(set(free)), "the free queue has a duplicate"
        assert set(free) == set(range(pool.num_blocks)) - set(users)
        # Every findable block holds exactly the tokens its hash names, and only full,
        # computed blocks are findable.
        assert len(pool.cached) == sum(h is not None for h in pool.block_hash)
        bs = kv.block_size
        for h, b in pool.cached.items():
            assert pool.block_hash[b] == h
            held = self.contents.get(b, ())
            assert len(held) % bs == 0 and held, f"cached block {b} is not full"
            chain: bytes | int | None = None
            for i in range(0, len(held), bs):
                block = list(held[i : i + bs])
                if kv.hasher is chain_hashes:
                    chain = hash_block(chain, block)  # type: ignore[arg-type]
                else:
                    chain = hash((chain or 0, *block))
            assert chain == h, f"cached block {b} holds other tokens than its hash says"

    @invariant()
    def check_request_states(self) -> None:
        if not self.configured:
            return
        sched, kv = self.scheduler, self.kv
        queued = [*sched.waiting, *sched.batch_waiting]
        live_ids = {r.request_id for r in self.live}
        tracked = [*sched.running, *queued]
        assert sorted(r.request_id for r in tracked) == sorted(live_ids)
        assert set(kv.block_tables) <= {r.request_id for r in sched.running}
        assert len(sched.running) <= self.config.max_num_seqs
        for req in sched.running:
            assert req.status == RequestStatus.RUNNING
            # After `advance` a table covers exactly the computed tokens: it grows to
            # `computed + scheduled` in `schedule` and `advance` adds the scheduled ones.
            assert len(kv.block_tables.get(req.request_id, [])) == kv.blocks_for(
                req.num_computed_tokens
            )
            assert req.num_computed_tokens < req.num_tokens
        for req in queued:
            assert req.status in (RequestStatus.WAITING, RequestStatus.PREEMPTED)
            assert req.request_id not in kv.block_tables
            assert req.num_computed_tokens == 0
        if self.config.scheduling_policy == "priority":  # waiting in (priority, arrival) order
            keys = [sched.key(r) for r in sched.waiting]
            assert keys == sorted(keys)
        else:  # running, then the static batch's queue, then waiting, is arrival order
            order = [self.arrival[r.request_id] for r in (*sched.running, *sched.batch_waiting)]
            order += [self.arrival[r.request_id] for r in sched.waiting]
            assert order == sorted(order)
        if self.config.batching == "continuous":
            assert not sched.batch_waiting
        else:
            assert len(sched.running) + len(sched.batch_waiting) <= self.config.max_num_seqs

    def teardown(self) -> None:
        if self.configured:
            self._drain()


TestRandomTrafficKeepsKVAccountingExactAndDrains = SchedulerMachine.TestCase
TestRandomTrafficKeepsKVAccountingExactAndDrains.settings = settings(
    max_examples=100,
    stateful_step_count=40,
    deadline=None,
    report_multiple_bugs=False,
    suppress_health_check=[HealthCheck.too_slow],
)
