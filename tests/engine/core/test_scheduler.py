"""Scheduling behaviour of a real `Scheduler` over a real `KVCacheManager`, with fake
sampled tokens standing in for the model (the way `LLMEngine.step` drives it)."""

from __future__ import annotations

import itertools

import pytest

from engine.config import Batching, SchedulerConfig
from engine.core.kv_cache_manager import KVCacheManager
from engine.core.request import FinishReason, Request, RequestStatus, SamplingParams
from engine.core.scheduler import Scheduler, SchedulerOutput

FAKE_TOKEN = 7


def make_scheduler(
    *,
    num_blocks: int = 64,
    block_size: int = 4,
    budget: int = 64,
    max_num_seqs: int = 8,
    chunked: bool = True,
    threshold: int = 0,
    batching: Batching = "continuous",
    max_model_len: int = 1024,
) -> Scheduler:
    config = SchedulerConfig(
        batching=batching,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=budget,
        enable_chunked_prefill=chunked,
        long_prefill_token_threshold=threshold,
    )
    return Scheduler(config, KVCacheManager(num_blocks, block_size), max_model_len)


def add(
    sched: Scheduler,
    request_id: str,
    prompt_len: int,
    max_tokens: int,
    tokens: list[int] | None = None,
) -> Request:
    """A request whose prompt shares no block with any other's (unless `tokens` are given):
    these tests are about scheduling, not the prefix cache."""
    sched.check_fits(prompt_len, max_tokens)
    if tokens is None:
        tokens = [next(_distinct) for _ in range(prompt_len)]
    req = Request(request_id, tokens, SamplingParams(max_tokens=max_tokens, ignore_eos=True))
    sched.add(req)
    return req


_distinct = itertools.count(1000)


def run_step(sched: Scheduler) -> SchedulerOutput:
    """Schedule and advance; a request whose tokens are all computed gets a fake sampled
    token and finishes (LENGTH) at max_tokens or the context length."""
    out = sched.schedule()
    sched.advance(out)
    for req, _ in out.scheduled:
        if req.num_computed_tokens == req.num_tokens:
            req.token_ids.append(FAKE_TOKEN)
            if (
                req.num_output_tokens >= req.params.max_tokens
                or req.num_tokens >= sched.max_model_len
            ):
                sched.finish(req, FinishReason.LENGTH)
    return out


def tokens(out: SchedulerOutput) -> dict[str, int]:
    """request id -> tokens scheduled this step, in scheduling order."""
    return {req.request_id: n for req, n in out.scheduled}


def running_ids(sched: Scheduler) -> list[str]:
    return [req.request_id for req in sched.running]


# ---- continuous batching -----------------------------------------------------------------


def test_continuous_admits_a_waiting_request_in_the_step_after_a_seat_frees() -> None:
    sched = make_scheduler(max_num_seqs=2)
    add(sched, "a", 4, max_tokens=1)
    add(sched, "b", 4, max_tokens=5)
    add(sched, "c", 4, max_tokens=5)

    assert tokens(run_step(sched)) == {"a": 4, "b": 4}  # c has no seat
    assert running_ids(sched) == ["b"]  # a finished on its first token

    assert tokens(run_step(sched)) == {"b": 1, "c": 4}


def test_finished_request_leaves_the_running_batch_and_frees_its_blocks_at_once() -> None:
    sched = make_scheduler()
    a = add(sched, "a", 9, max_tokens=2)
    add(sched, "b", 4, max_tokens=10)
    run_step(sched)
    assert len(sched.kv.block_tables["a"]) == 3

    run_step(sched)  # a's second token: done

    assert a.status == RequestStatus.FINISHED
    assert a.finish_reason == FinishReason.LENGTH
    assert running_ids(sched) == ["b"]
    assert "a" not in sched.kv.block_tables
    assert sched.kv.num_used_blocks == len(sched.kv.block_tables["b"])


def test_continuous_admits_a_new_arrival_into_the_running_batch() -> None:
    sched = make_scheduler()
    add(sched, "a", 8, max_tokens=10)
    run_step(sched)
    run_step(sched)

    add(sched, "b", 6, max_tokens=10)

    assert tokens(run_step(sched)) == {"a": 1, "b": 6}


def test_continuous_admits_a_request_once_the_token_budget_has_room() -> None:
    sched = make_scheduler(budget=16)
    add(sched, "a", 16, max_tokens=10)
    add(sched, "b", 10, max_tokens=10)

    assert tokens(run_step(sched)) == {"a": 16}  # the budget is spent
    assert tokens(run_step(sched)) == {"a": 1, "b": 10}


def test_continuous_admits_a_request_as_soon_as_free_blocks_can_hold_it() -> None:
    sched = make_scheduler(num_blocks=6, block_size=4)
    add(sched, "a", 12, max_tokens=1)  # 3 blocks
    add(sched, "b", 8, max_tokens=10)  # 2 blocks
    add(sched, "c", 8, max_tokens=10)  # 2 blocks: only 1 is left

    assert tokens(run_step(sched)) == {"a": 12, "b": 8}
    assert [r.request_id for r in sched.waiting] == ["c"]
    assert sched.kv.pool.num_free == 4  # a finished and gave back its 3 blocks

    assert tokens(run_step(sched)) == {"b": 1, "c": 8}


# ---- chunked prefill -----------------------------------------------------------------------


def test_chunked_prefill_splits_a_long_prompt_into_chunks_of_the_budget() -> None:
    sched = make_scheduler(budget=16)
    a = add(sched, "a", 40, max_tokens=2)

    chunks = [tokens(run_step(sched))["a"] for _ in range(3)]

    assert chunks == [16, 16, 8]
    assert a.num_output_tokens == 1  # sampled only once the whole prompt was computed


def test_chunked_prefill_gives_a_long_prompt_the_budget_left_after_ongoing_decodes() -> None:
    sched = make_scheduler(budget=16)
    add(sched, "a", 4, max_tokens=20)
    add(sched, "b", 4, max_tokens=20)
    run_step(sched)

    add(sched, "long", 40, max_tokens=2)

    assert tokens(run_step(sched)) == {"a": 1, "b": 1, "long": 14}
    assert tokens(run_step(sched)) == {"a": 1, "b": 1, "long": 14}
    assert tokens(run_step(sched)) == {"a": 1, "b": 1, "long": 12}


def test_long_prefill_token_threshold_caps_every_prefill_chunk() -> None:
    sched = make_scheduler(budget=32, threshold=5)
    add(sched, "a", 23, max_tokens=2)
    add(sched, "b", 7, max_tokens=2)

    steps = [tokens(run_step(sched)) for _ in range(5)]

    assert steps[0] == {"a": 5, "b": 5}
    assert all(n <= 5 for step in steps for n in step.values())
    assert [step["a"] for step in steps] == [5, 5, 5, 5, 3]


def test_long_prefill_token_threshold_leaves_decodes_at_one_token() -> None:
    sched = make_scheduler(budget=32, threshold=5)
    add(sched, "a", 5, max_tokens=4)
    run_step(sched)

    assert tokens(run_step(sched)) == {"a": 1}


# ---- no chunked prefill --------------------------------------------------------------------


def test_without_chunked_prefill_a_prompt_is_scheduled_whole() -> None:
    sched = make_scheduler(budget=32, chunked=False)
    add(sched, "a", 32, max_tokens=2)

    assert tokens(run_step(sched)) == {"a": 32}


def test_without_chunked_prefill_a_prompt_waits_until_the_budget_left_holds_all_of_it() -> None:
    sched = make_scheduler(budget=32, chunked=False)
    add(sched, "a", 4, max_tokens=5)
    add(sched, "b", 30, max_tokens=2)

    assert tokens(run_step(sched)) == {"a": 4}  # 28 left: b waits rather than split
    assert sched.waiting[0].request_id == "b"
    assert sched.waiting[0].num_computed_tokens == 0

    assert tokens(run_step(sched)) == {"a": 1, "b": 30}


def test_without_chunked_prefill_check_fits_rejects_a_prompt_longer_than_the_budget() -> None:
    sched = make_scheduler(budget=32, chunked=False)

    with pytest.raises(ValueError, match=r"max_num_batched_tokens=32.*chunked prefill"):
        sched.check_fits(33, 1)
    sched.check_fits(32, 1)


def test_with_chunked_prefill_check_fits_accepts_a_prompt_longer_than_the_budget() -> None:
    sched = make_scheduler(budget=32, chunked=True)

    sched.check_fits(200, 1)


# ---- admission checks ----------------------------------------------------------------------


def test_check_fits_rejects_a_request_that_needs_more_blocks_than_the_pool() -> None:
    sched = make_scheduler(num_blocks=8, block_size=4)  # 32 tokens

    with pytest.raises(ValueError, match=r"needs 9 KV blocks; the cache has 8"):
        sched.check_fits(20, 13)
    sched.check_fits(20, 12)


def test_check_fits_counts_blocks_only_up_to_the_context_length() -> None:
    sched = make_scheduler(num_blocks=8, block_size=4, max_model_len=32)

    sched.check_fits(20, 1000)  # generation stops at 32 tokens, which 8 blocks hold


def test_check_fits_rejects_a_prompt_that_fills_the_context_length() -> None:
    sched = make_scheduler(max_model_len=64)

    for prompt_len in (64, 65, 500):
        with pytest.raises(ValueError, match=r"context length is 64"):
            sched.check_fits(prompt_len, 1)
    sched.check_fits(63, 1)


# ---- static batching -----------------------------------------------------------------------


def test_static_batching_admits_the_next_batch_only_after_the_whole_batch_finished() -> None:
    sched = make_scheduler(batching="static", max_num_seqs=2)
    add(sched, "a", 4, max_tokens=1)
    add(sched, "b", 4, max_tokens=4)
    add(sched, "c", 4, max_tokens=1)

    assert tokens(run_step(sched)) == {"a": 4, "b": 4}
    for _ in range(3):  # a's seat stays idle while b finishes
        assert tokens(run_step(sched)) == {"b": 1}
        assert [r.request_id for r in sched.waiting] == ["c"]
    assert not sched.running

    assert tokens(run_step(sched)) == {"c": 4}


def test_static_batching_does_not_let_a_new_arrival_join_a_running_batch() -> None:
    sched = make_scheduler(batching="static", max_num_seqs=4)
    add(sched, "a", 4, max_tokens=3)
    run_step(sched)

    add(sched, "b", 4, max_tokens=1)

    assert tokens(run_step(sched)) == {"a": 1}
    assert tokens(run_step(sched)) == {"a": 1}
    assert tokens(run_step(sched)) == {"b": 4}


def test_static_batch_holds_at_most_max_num_seqs_requests() -> None:
    sched = make_scheduler(batching="static", max_num_seqs=2)
    for i in range(5):
        add(sched, f"r{i}", 4, max_tokens=2)

    batches: list[set[str]] = []
    for _ in range(100):
        scheduled = set(tokens(run_step(sched)))
        if not batches or not scheduled <= batches[-1]:
            batches.append(scheduled)
        if not sched.has_unfinished():
            break

    assert batches == [{"r0", "r1"}, {"r2", "r3"}, {"r4"}]


# ---- preemption ----------------------------------------------------------------------------


def fill_pool_with_three_requests() -> tuple[Scheduler, Request, Request, Request]:
    """a, b, c admitted in that order, their 8-token prompts filling all 6 blocks."""
    sched = make_scheduler(num_blocks=6, block_size=4)
    a = add(sched, "a", 8, max_tokens=4)
    b = add(sched, "b", 8, max_tokens=4)
    c = add(sched, "c", 8, max_tokens=4)
    assert tokens(run_step(sched)) == {"a": 8, "b": 8, "c": 8}
    assert sched.kv.pool.num_free == 0
    return sched, a, b, c


def test_out_of_blocks_preempts_the_most_recently_admitted_running_request() -> None:
    sched, _, _, c = fill_pool_with_three_requests()
    add(sched, "d", 4, max_tokens=1)

    out = run_step(sched)  # a and b each need a third block

    assert out.preempted == [c]
    assert tokens(out) == {"a": 1, "b": 1}
    assert c.status == RequestStatus.PREEMPTED
    assert c.num_computed_tokens == 0
    assert "c" not in sched.kv.block_tables
    assert c.num_output_tokens == 1  # its sampled token is kept and recomputed
    assert c.metrics.num_preemptions == 1
    assert sched.num_preemptions == 1
    assert [r.request_id for r in sched.waiting] == ["c", "d"]  # front of the queue
    assert running_ids(sched) == ["a", "b"]


def test_a_running_request_preempts_itself_when_it_is_the_most_recently_admitted() -> None:
    sched = make_scheduler(num_blocks=4, block_size=4)
    a = add(sched, "a", 7, max_tokens=4)  # its 8th token still fits in its 2 blocks
    b = add(sched, "b", 8, max_tokens=4)  # its 9th token needs a 3rd block
    run_step(sched)
    a_blocks = list(sched.kv.block_tables["a"])

    out = run_step(sched)

    assert tokens(out) == {"a": 1}
    assert out.preempted == [b]
    assert b.status == RequestStatus.PREEMPTED
    assert running_ids(sched) == ["a"]
    assert sched.kv.block_tables["a"] == a_blocks
    assert a.status == RequestStatus.RUNNING


def test_a_preempted_request_resumes_by_recomputing_prompt_and_output_then_finishes() -> None:
    sched, a, b, c = fill_pool_with_three_requests()
    run_step(sched)  # c preempted

    recompute: int | None = None
    for _ in range(50):
        out = tokens(run_step(sched))
        if recompute is None and "c" in out:
            recompute = out["c"]
        if not sched.has_unfinished():
            break

    assert recompute == 9  # 8 prompt tokens + the 1 output token sampled before preemption
    for req in (a, b, c):
        assert req.status == RequestStatus.FINISHED
        assert req.num_output_tokens == 4
    assert sched.kv.num_used_blocks == 0


def test_running_requests_stay_in_arrival_order_across_preemption_and_resume() -> None:
    sched, _, _, _ = fill_pool_with_three_requests()
    add(sched, "d", 4, max_tokens=8)

    orders: list[list[str]] = []
    for _ in range(100):
        run_step(sched)
        orders.append(running_ids(sched))
        if not sched.has_unfinished():
            break

    arrival = {"a": 0, "b": 1, "c": 2, "d": 3}
    assert not sched.has_unfinished()
    assert sched.num_preemptions >= 1
    for order in orders:
        assert order == sorted(order, key=arrival.__getitem__)
