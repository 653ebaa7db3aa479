"""The max_len KV reservation (a contiguous allocator's baseline) and what the step log and
/metrics tell about KV use and queueing: at the same pool, max_len fits fewer sequences and
wastes most of what it reserves, while computing exactly the same tokens as paged."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from engine import LLM, SamplingParams
from engine.config import EngineConfig, engine_arg_names
from engine.engine import LLMEngine

TINY = "tiny-llama"  # random weights, vocab 512, context 1024
BLOCK = 16
MAX_LEN = 128  # a max_len reservation: 8 blocks
POOL = 24  # 3 reservations, or 12 requests of up to 32 tokens paged
GREEDY = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)


def engine(reservation: str, **kw: Any) -> LLMEngine:
    args: dict[str, Any] = dict(dtype="float32", max_model_len=MAX_LEN, num_kv_blocks=POOL)
    return LLMEngine(EngineConfig.from_kwargs(TINY, kv_reservation=reservation, **args | kw))


def prompt(i: int, n: int = 10) -> list[int]:
    return [(i * 37 + j) % 500 + 2 for j in range(n)]


def run(eng: LLMEngine, n: int, params: SamplingParams = GREEDY) -> int:
    """Add n requests at once and step to the end; the most that ran at once."""
    for i in range(n):
        eng.add_request(str(i), prompt(i), params)
    most = 0
    while eng.has_unfinished_requests():
        eng.step()
        most = max(most, len(eng.scheduler.running))
    return most


def steps(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_max_len_admits_only_what_whole_context_reservations_leave_room_for() -> None:
    fits = POOL // -(-MAX_LEN // BLOCK)
    assert run(engine("max_len", max_num_seqs=16), 10) == fits == 3
    assert run(engine("paged", max_num_seqs=16), 10) > fits


def test_max_len_reserves_every_block_at_admission_and_frees_them_at_the_end() -> None:
    eng = engine("max_len")
    eng.add_request("a", prompt(0), GREEDY)
    tables = []
    while eng.has_unfinished_requests():
        eng.step()
        tables.append(list(eng.kv.block_tables.get("a", [])))
    assert tables[0] == tables[-2] and len(tables[0]) == MAX_LEN // BLOCK  # never grows
    assert tables[-1] == [] and eng.kv.num_used_blocks == 0


def test_greedy_outputs_are_the_same_under_both_reservations() -> None:
    prompts = [prompt(i, 5 + 7 * i) for i in range(6)]
    outs = {
        r: LLM(
            TINY, dtype="float32", max_model_len=MAX_LEN, num_kv_blocks=POOL, kv_reservation=r
        ).generate(prompts, GREEDY)
        for r in ("paged", "max_len")
    }
    tokens = {r: [o.outputs[0].token_ids for o in out] for r, out in outs.items()}
    assert tokens["max_len"] == tokens["paged"]
    assert all(len(t) == GREEDY.max_tokens for t in tokens["paged"])


def test_max_len_turns_prefix_caching_off_in_the_resolved_config() -> None:
    eng = engine("max_len")
    assert eng.config.cache.enable_prefix_caching is False
    assert eng.config.to_dict()["cache"]["kv_reservation"] == "max_len"
    assert engine("paged").config.cache.enable_prefix_caching is True


def test_step_log_counts_stored_and_read_kv_tokens(tmp_path: Path) -> None:
    eng = engine("paged")
    eng.log_steps(tmp_path / "steps.jsonl")
    eng.add_request("a", prompt(0, 10), SamplingParams(max_tokens=3, ignore_eos=True))
    eng.add_request("b", prompt(1, 20), SamplingParams(max_tokens=3, ignore_eos=True))
    while eng.has_unfinished_requests():
        eng.step()
    lines = steps(tmp_path / "steps.jsonl")
    # Step 1 prefills both prompts; steps 2 and 3 decode one token each; both end at step 3.
    assert [line["context_tokens"] for line in lines] == [30, 32, 34]
    assert [line["kv_tokens"] for line in lines] == [30, 32, 0]
    assert [len(line["queue_s"]) for line in lines] == [2, 0, 0]
    assert all(q >= 0 for q in lines[0]["queue_s"])


def test_step_log_has_one_queue_delay_per_request(tmp_path: Path) -> None:
    eng = engine("paged", max_num_seqs=2)
    eng.log_steps(tmp_path / "steps.jsonl")
    run(eng, 5)
    delays = [q for line in steps(tmp_path / "steps.jsonl") for q in line["queue_s"]]
    assert len(delays) == 5 and all(q >= 0 for q in delays)


def test_max_len_leaves_most_reserved_kv_empty(tmp_path: Path) -> None:
    waste = {}
    for r in ("paged", "max_len"):
        eng = engine(r)
        eng.log_steps(tmp_path / f"{r}.jsonl")
        run(eng, 3)
        first = steps(tmp_path / f"{r}.jsonl")[0]  # three 10-token prompts prefilled
        waste[r] = 1 - first["kv_tokens"] / (first["kv_blocks_used"] * BLOCK)
    assert waste["max_len"] == 1 - 30 / (3 * MAX_LEN)
    assert waste["paged"] == 1 - 30 / (3 * BLOCK)
    assert waste["max_len"] > 0.9


def test_max_len_refuses_a_request_when_one_reservation_exceeds_the_pool() -> None:
    small = engine("paged", num_kv_blocks=4)
    small.add_request("fits", prompt(0), GREEDY)  # 18 tokens: 2 blocks, paged
    eng = engine("max_len", num_kv_blocks=4)
    with pytest.raises(ValueError, match="kv_reservation=max_len reserves 8 KV blocks"):
        eng.add_request("a", prompt(0), GREEDY)


def test_a_bad_kv_reservation_is_refused() -> None:
    with pytest.raises(ValueError, match="kv_reservation must be 'paged' or 'max_len'"):
        EngineConfig.from_kwargs(TINY, kv_reservation="contiguous")


PROFILE = {"rate": 1.0, "num_requests": 4, "kv_reservation": "max_len"}


def test_kv_reservation_is_a_profile_key_and_a_serve_flag() -> None:
    from bench_cli.local_server import serve_flags
    from loadgen.profiles import build_config

    assert "kv_reservation" in engine_arg_names()
    cfg = build_config(dict(PROFILE), {}, engine_arg_names())
    assert cfg.engine == {"kv_reservation": "max_len"}
    assert serve_flags(cfg.engine) == ["--kv-reservation", "max_len"]


def test_metrics_page_has_a_queue_time_histogram() -> None:
    from aiohttp.test_utils import TestClient, TestServer

    from engine.serving.async_engine import AsyncLLMEngine
    from engine.serving.server import build_app

    async def scrape() -> str:
        app = build_app(AsyncLLMEngine(engine("max_len")), TINY)
        async with TestClient(TestServer(app)) as client:
            body = {"prompt": [prompt(0), prompt(1)], "max_tokens": 2, "ignore_eos": True}
            reply = await client.post("/v1/completions", json=body)
            assert reply.status == 200, await reply.text()
            return await (await client.get("/metrics")).text()

    text = asyncio.run(scrape())
    assert "# TYPE servebench:request_queue_time_seconds histogram" in text
    assert "servebench:request_queue_time_seconds_count 2" in text.splitlines()
    assert 'kv_reservation="max_len"' in text
