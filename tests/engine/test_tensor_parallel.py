"""Tensor parallelism on CPU (gloo): how heads, MLP and vocabulary split, greedy output equal
to one rank's with other engine features on, and worker processes that start, fail and stop
cleanly (no orphans)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from typing import Any

import pytest
import torch

from engine import LLM, SamplingParams, kernel_pool
from engine.distributed.sharding import Shard, vocab_sizes
from engine.distributed.workers import threads_per_rank
from engine.model.sources import TINY_CONFIGS
from engine.ops import cpu_kernels

PROMPTS = [
    [(11 * k) % 400 + 5 for k in range(70)],
    [7, 8, 9, 10, 11] * 9,
    [3, 4] + [(5 * k * k) % 500 for k in range(30)],
    [42],
]
PARAMS = SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True)


def tokens(llm: LLM, prompts: list = PROMPTS, params: SamplingParams = PARAMS) -> list:
    return [o.outputs[0].token_ids for o in llm.generate(prompts, params)]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie is gone too
        return f.read().split(")")[-1].split()[0] != "Z"


# ---- the split ---------------------------------------------------------------------------


def test_heads_split_by_kv_group_unevenly_when_they_must() -> None:
    from engine.config import ModelConfig

    smol = ModelConfig(49152, 576, 1536, 30, num_heads=9, num_kv_heads=3, head_dim=64)
    ranks = [Shard.plan(smol, r, 2) for r in range(2)]
    assert [s.kv_heads for s in ranks] == [range(0, 2), range(2, 3)]
    assert [s.q_heads for s in ranks] == [range(0, 6), range(6, 9)]  # whole GQA groups
    assert [s.intermediate for s in ranks] == [range(0, 768), range(768, 1536)]
    assert vocab_sizes(49152, 2) == [24576, 24576] and vocab_sizes(10, 3) == [4, 3, 3]
    local = ranks[1].local_config(smol)
    assert (local.num_heads, local.num_kv_heads, local.intermediate_size) == (3, 1, 768)
    assert local.vocab_size == 49152


def test_fewer_kv_heads_than_ranks_replicate_them_or_are_refused() -> None:
    tiny = TINY_CONFIGS["tiny-llama"]  # 4 query heads, 2 KV heads
    ranks = [Shard.plan(tiny, r, 4) for r in range(4)]
    assert [s.q_heads for s in ranks] == [range(i, i + 1) for i in range(4)]
    assert [s.kv_heads for s in ranks] == [range(0, 1), range(0, 1), range(1, 2), range(1, 2)]
    with pytest.raises(ValueError, match="tensor_parallel_size=3 does not fit 4 query / 2 KV"):
        Shard.plan(tiny, 0, 3)


# ---- the same tokens ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def one_rank() -> list:
    return tokens(LLM("tiny-llama", enforce_eager=True))


@pytest.mark.parametrize(
    "args",
    [
        {},
        {"tensor_parallel_size": 4},  # KV heads replicated
        {"max_num_batched_tokens": 16, "num_kv_blocks": 12},  # chunked prefill, preemption
        {"speculative_config": {"method": "ngram", "num_speculative_tokens": 3}},
        {"speculative_config": {"method": "draft_layers", "num_draft_layers": 1}},
        {"model": "tiny-llama-untied", "enable_prefix_caching": False},
        {"attention_backend": "triton"},  # each rank's kernels in Triton's interpreter
    ],
    ids=["tp2", "tp4", "chunked-preempted", "ngram", "draft-layers", "untied-head", "triton"],
)
def test_greedy_output_equals_one_rank(args: dict[str, Any], one_rank: list) -> None:
    args = dict(args)
    model = args.pop("model", "tiny-llama")
    want = one_rank if model == "tiny-llama" else tokens(LLM(model, enforce_eager=True))
    llm = LLM(model, **{"tensor_parallel_size": 2, **args})
    try:
        assert tokens(llm) == want
        # Prompts sharing a prefix with an earlier one: prefix-cache hits across ranks.
        again = tokens(llm, PROMPTS[:2])
        assert again == want[:2]
        stats = llm.llm_engine.stats()
        assert stats["tp_allreduces_total"] > 0 and stats["tp_allreduce_seconds_total"] > 0
        assert stats["kv_blocks_used"] == 0
    finally:
        llm.llm_engine.shutdown()


def first_difference(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y), len(a))


def test_fp8_kv_cache_is_exact_and_fp8_weights_close_when_sharded(one_rank: list) -> None:
    """An fp8 KV cache keeps its per-head scales on the head's rank: the same tokens. fp8
    row-parallel weights get per-shard scales (each rank quantizes its columns), so tokens
    may part from one rank's fp8 run, but later than fp8 parts from float32."""
    for args in (dict(kv_cache_dtype="fp8"), dict(quantization="fp8")):
        want = tokens(LLM("tiny-llama", enforce_eager=True, **args))
        llm = LLM("tiny-llama", tensor_parallel_size=2, **args)
        try:
            got = tokens(llm)
        finally:
            llm.llm_engine.shutdown()
        if "kv_cache_dtype" in args:
            assert got == want
        else:
            sharding = [first_difference(g, w) for g, w in zip(got, want, strict=True)]
            fp8 = [first_difference(w, r) for w, r in zip(want, one_rank, strict=True)]
            assert all(s >= f for s, f in zip(sharding, fp8, strict=True)), (sharding, fp8)


@pytest.mark.slow
def test_smollm2_two_ranks_give_the_same_tokens() -> None:
    from tests.engine.test_modes import PARAMS as SMOL_PARAMS
    from tests.engine.test_modes import PROMPTS as TEXTS

    want = tokens(LLM("smollm2-135m", dtype="float32"), TEXTS, SMOL_PARAMS)
    llm = LLM("smollm2-135m", dtype="float32", tensor_parallel_size=2)
    try:
        assert tokens(llm, TEXTS, SMOL_PARAMS) == want
    finally:
        llm.llm_engine.shutdown()


# ---- processes ---------------------------------------------------------------------------


def test_shutdown_stops_the_workers_and_a_second_engine_can_start() -> None:
    llm = LLM("tiny-llama", tensor_parallel_size=2)
    procs = llm.llm_engine.workers.procs
    assert all(p.poll() is None for p in procs)
    llm.llm_engine.shutdown()
    assert all(p.poll() == 0 for p in procs)
    llm = LLM("tiny-llama", tensor_parallel_size=2)
    try:
        assert len(tokens(llm)[0]) == PARAMS.max_tokens
    finally:
        llm.llm_engine.shutdown()


@pytest.mark.skipif(not cpu_kernels.available(), reason="needs the engine's CPU kernels")
def test_the_driver_takes_its_share_of_threads_after_an_engine_with_a_pool() -> None:
    """rank 0 runs on its share of the cores whatever an earlier engine of this process took:
    a kernel pool remembers torch's thread count from before it (the whole machine)."""
    from engine.ops.cpu_linear import PackedLinear
    from tests.engine.ops.test_cpu_pool import _Tiny

    before = torch.get_num_threads()
    torch.set_num_threads(3)
    try:
        earlier = _Tiny(torch.float32, PackedLinear(torch.randn(32, 16)))
        assert kernel_pool.take_threads(earlier, torch.float32, 64).pool_threads == 3
        llm = LLM("tiny-llama", tensor_parallel_size=2)
        try:
            assert torch.get_num_threads() == threads_per_rank(2)
            assert torch.ops.servebench.pool_threads() <= threads_per_rank(2)
        finally:
            llm.llm_engine.shutdown()
    finally:
        kernel_pool.give_back()
        torch.set_num_threads(before)


def test_a_crashed_worker_is_a_clear_error() -> None:
    llm = LLM("tiny-llama", tensor_parallel_size=2)
    try:
        worker = llm.llm_engine.workers.procs[0]
        worker.kill()
        worker.wait()
        with pytest.raises(RuntimeError, match="tensor-parallel worker rank 1 exited"):
            llm.generate([[5, 6, 7]], PARAMS)
    finally:
        llm.llm_engine.shutdown()


def test_workers_die_with_their_driver() -> None:
    """A driver killed outright (SIGKILL: no clean-up runs) leaves no worker behind."""
    code = (
        "from engine import LLM\n"
        "llm = LLM('tiny-llama', tensor_parallel_size=2)\n"
        "print(*[p.pid for p in llm.llm_engine.workers.procs], flush=True)\n"
        "import time; time.sleep(120)\n"
    )
    driver = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert driver.stdout is not None
    pids = [int(p) for p in driver.stdout.readline().split()]
    assert pids and all(alive(p) for p in pids)
    driver.send_signal(signal.SIGKILL)
    driver.wait()
    deadline = time.monotonic() + 20
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(alive(p) for p in pids)


def test_unsupported_combinations_are_refused() -> None:
    with pytest.raises(ValueError, match="tensor_parallel_size must be an integer >= 1"):
        LLM("tiny-llama", tensor_parallel_size=0)
    with pytest.raises(ValueError, match="does not fit"):
        LLM("tiny-llama", tensor_parallel_size=3)
