"""Priority scheduling (vLLM's `scheduling_policy="priority"`): waiting requests are served in
(priority, arrival) order, lower first; the KV pool's victim is the lowest-priority, latest
arrival; a waiting request of higher priority preempts a running one of lower priority when
no block or seat is free. Under `fcfs` arrival order holds whatever the priorities."""

from __future__ import annotations

import itertools

import pytest

from engine import LLM, SamplingParams
from engine.config import SchedulerConfig
from engine.core.kv_cache_manager import KVCacheManager
from engine.core.request import FinishReason, Request
from engine.core.scheduler import Scheduler

_ids = itertools.count(1000)


def make(policy: str, num_blocks: int = 64, max_num_seqs: int = 8, budget: int = 64) -> Scheduler:
    config = SchedulerConfig(
        max_num_seqs=max_num_seqs, max_num_batched_tokens=budget, scheduling_policy=policy
    )
    return Scheduler(config, KVCacheManager(num_blocks, 4), max_model_len=1024)


def add(
    sched: Scheduler, rid: str, prompt_len: int, priority: int, max_tokens: int = 50
) -> Request:
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    req = Request(rid, [next(_ids) for _ in range(prompt_len)], params, priority=priority)
    sched.add(req)
    return req


def step(sched: Scheduler) -> list[str]:
    """One step with fake sampled tokens; the ids scheduled, in order."""
    out = sched.schedule()
    sched.advance(out)
    for req, _ in out.scheduled:
        if req.num_computed_tokens == req.num_tokens:
            req.token_ids.append(7)
            if req.num_output_tokens >= req.params.max_tokens:
                sched.finish(req, FinishReason.LENGTH)
    return [r.request_id for r, _ in out.scheduled]


@pytest.mark.parametrize(
    ("policy", "order"), [("priority", ["c", "a", "b"]), ("fcfs", ["a", "b", "c"])]
)
def test_waiting_requests_are_admitted_in_service_order(policy: str, order: list[str]) -> None:
    sched = make(policy, max_num_seqs=1)
    add(sched, "a", 4, priority=1, max_tokens=1)
    add(sched, "b", 4, priority=1, max_tokens=1)
    add(sched, "c", 4, priority=0, max_tokens=1)
    admitted = [step(sched)[0] for _ in range(3)]
    assert admitted == order


def test_a_high_priority_arrival_preempts_a_low_priority_request_when_blocks_run_out() -> None:
    sched = make("priority", num_blocks=6)
    low = add(sched, "low", 20, priority=5)  # 5 of the 6 blocks
    step(sched)
    high = add(sched, "high", 8, priority=0)  # needs 2 blocks: only 1 is free
    assert step(sched) == ["high"]
    assert low in sched.waiting and low.metrics.num_preemptions == 1
    assert high in sched.running


def test_a_high_priority_arrival_takes_the_seat_of_a_low_priority_one() -> None:
    sched = make("priority", max_num_seqs=1)
    add(sched, "low", 4, priority=3)
    step(sched)
    add(sched, "high", 4, priority=0)
    assert step(sched) == ["high"]
    assert [r.request_id for r in sched.waiting] == ["low"]


def test_fcfs_never_preempts_for_a_waiting_request() -> None:
    sched = make("fcfs", max_num_seqs=1)
    add(sched, "low", 4, priority=3)
    step(sched)
    add(sched, "high", 4, priority=0)
    assert step(sched) == ["low"] and sched.num_preemptions == 0


def test_the_victim_is_the_lowest_priority_latest_arrival_not_the_last_admitted() -> None:
    """a (priority 0) needs a block when none is free: under fcfs the last admitted (c) goes,
    under priority the worst (b, priority 9), though c came after it."""
    for policy, victim in (("fcfs", "c"), ("priority", "b")):
        sched = make(policy, num_blocks=6)
        add(sched, "a", 4, priority=0)  # 1 block, full: its next token needs another
        add(sched, "b", 8, priority=9)  # 2 blocks
        add(sched, "c", 12, priority=1)  # 3 blocks
        step(sched)
        assert sched.kv.pool.num_free == 0
        step(sched)
        assert [r.request_id for r in sched.waiting] == [victim], policy


def test_high_priority_behind_many_low_priority_ones_gets_its_first_token_first() -> None:
    """A full engine: six low-priority requests then one high-priority one, all waiting
    before the first step, two seats. Under priority the last arrival is served first; under
    fcfs arrival order holds (its priority is accepted and not used)."""
    params = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)

    def first_tokens(policy: str) -> list[str]:
        llm = LLM("tiny-llama", max_num_seqs=2, scheduling_policy=policy)
        engine = llm.llm_engine
        for i in range(6):
            engine.add_request(f"low{i}", [10 + i] * 20, params, priority=1)
        engine.add_request("high", [99] * 20, params, priority=0)
        firsts: list[str] = []
        while engine.has_unfinished_requests():
            for out in engine.step():
                if len(out.outputs[0].token_ids) == 1:
                    firsts.append(out.request_id)
        return firsts

    assert first_tokens("priority")[0] == "high"
    assert first_tokens("fcfs") == [f"low{i}" for i in range(6)] + ["high"]


def test_priority_goes_through_llm_generate_and_is_checked() -> None:
    llm = LLM("tiny-llama", max_num_seqs=1, scheduling_policy="priority")
    params = SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True)
    outs = llm.generate([[5] * 8, [6] * 8], params, priority=[1, 0])
    assert outs[1].metrics.first_token_time < outs[0].metrics.first_token_time
    with pytest.raises(ValueError, match="one priority per prompt"):
        llm.generate([[5] * 8], params, priority=[1, 2])
    with pytest.raises(ValueError, match="priority must be an integer"):
        llm.llm_engine.add_request("x", [5] * 8, params, priority=0.5)  # type: ignore[arg-type]
