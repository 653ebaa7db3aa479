"""The scheduler's waiting queues: service order (priority, then arrival; FCFS with
front-insertion), O(1) removal, and O(log n) comparisons per insertion however long the
queue (counted, not timed)."""

import itertools
from typing import Any

import pytest

from engine import SamplingParams
from engine.config import EngineConfig, SchedulerConfig
from engine.core.kv_cache_manager import KVCacheManager
from engine.core.request import Request
from engine.core.request_queue import RequestQueue
from engine.core.scheduler import Scheduler
from engine.engine import LLMEngine

_ids = itertools.count()


def req(name: str, priority: int = 0, arrival: float = 0.0) -> Request:
    r = Request(name, [1, 2], SamplingParams(), arrival_time=arrival, priority=priority)
    r.arrival_seq = next(_ids)
    return r


def names(q: RequestQueue) -> list[str]:
    return [r.request_id for r in q]


def test_priority_queue_serves_priority_then_arrival_and_removes_lazily() -> None:
    sched = Scheduler(
        SchedulerConfig(max_num_batched_tokens=64, scheduling_policy="priority"),
        KVCacheManager(8, 4),
        max_model_len=64,
    )
    q = RequestQueue(sched.key)
    a, b, c, d = req("a", 1, 1.0), req("b", 0, 2.0), req("c", 1, 0.5), req("d", 0, 2.0)
    for r in (a, b, c, d):
        q.add(r, front=True)  # `front` means nothing under priority
    assert names(q) == ["b", "d", "c", "a"]  # equal keys: in the order added
    assert q.remove(d) and not q.remove(d) and d not in q and len(q) == 3
    assert (q.peek().request_id, q.pop().request_id) == ("b", "b")
    q.add(b)  # a preempted request goes back by its key: ahead again
    assert [q.pop().request_id for _ in range(3)] == ["b", "c", "a"]
    assert not q
    with pytest.raises(IndexError):
        q.peek()


def test_fcfs_queue_keeps_arrival_order_with_front_insertion() -> None:
    q = RequestQueue()
    rs = [req(n) for n in "abcd"]
    for r in rs[:3]:
        q.add(r)
    q.add(rs[3], front=True)  # a preempted request or held-back sibling
    assert names(q) == ["d", "a", "b", "c"] and q[0] is rs[3]
    q.remove(rs[3])
    q.remove(rs[1])
    assert names(q) == ["a", "c"] and q.pop() is rs[0] and len(q) == 1


def test_many_removals_leave_no_dead_entries_behind() -> None:
    q = RequestQueue()
    rs = [req(str(i)) for i in range(1000)]
    for r in rs:
        q.add(r)
    for r in rs[1:-1]:
        q.remove(r)
    assert names(q) == ["0", "999"] and len(q._fifo) < 200


class CountingKey(tuple):
    comparisons = 0

    def __lt__(self, other: Any) -> bool:
        CountingKey.comparisons += 1
        return tuple.__lt__(self, other)

    def __gt__(self, other: Any) -> bool:
        CountingKey.comparisons += 1
        return tuple.__gt__(self, other)

    def __eq__(self, other: object) -> bool:
        CountingKey.comparisons += 1
        return tuple.__eq__(self, other)

    __hash__ = tuple.__hash__


def test_inserting_ahead_of_a_long_queue_costs_log_n_comparisons(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """1,000 urgent requests inserted ahead of 1,000 waiting ones: a scan per insertion
    made ~1,000,000 comparisons; a heap makes O(n log n)."""
    key = Scheduler.key
    monkeypatch.setattr(Scheduler, "key", lambda self, r: CountingKey(key(self, r)))
    sched = Scheduler(
        SchedulerConfig(max_num_batched_tokens=64, scheduling_policy="priority"),
        KVCacheManager(8, 4),
        max_model_len=64,
    )
    n = 1000
    for i in range(n):
        sched.add(Request(f"low{i}", [1], SamplingParams(), arrival_time=float(i), priority=1))
    CountingKey.comparisons = 0
    for i in range(n):
        sched.add(Request(f"hi{i}", [1], SamplingParams(), arrival_time=n + i, priority=0))
    assert CountingKey.comparisons < 4 * n * (2 * n).bit_length()
    served = [sched.waiting.pop().request_id for _ in range(2 * n)]
    assert served == [f"hi{i}" for i in range(n)] + [f"low{i}" for i in range(n)]


def test_an_urgent_request_is_served_at_once_behind_parallel_sampling_batches() -> None:
    engine = LLMEngine(
        EngineConfig.from_kwargs(
            "tiny-llama", max_num_seqs=8, num_kv_blocks=256, scheduling_policy="priority"
        )
    )
    wide = SamplingParams(max_tokens=8, n=64, ignore_eos=True)
    engine.add_request("wide0", [5] * 40, wide)
    engine.add_request("wide1", [6] * 40, wide)
    for _ in range(3):
        engine.step()
    assert engine.num_waiting > 100  # siblings queued or held
    engine.add_request("urgent", [7] * 8, SamplingParams(max_tokens=1), priority=-1)
    outs = engine.step()
    assert any(o.request_id == "urgent" and o.finished for o in outs)
    while engine.has_unfinished_requests():
        engine.step()
    assert engine.num_waiting == 0
