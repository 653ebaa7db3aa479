"""--max-queue counts sequences (a request of n = 256 is 256), and the waiting counts behind
it are exact: held-back siblings included, never negative."""

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from engine import SamplingParams
from engine.config import EngineConfig
from engine.engine import LLMEngine
from engine.serving.app_state import ENGINE_KEY, ServerState
from engine.serving.async_engine import AsyncLLMEngine
from engine.serving.server import build_app


def tiny_engine() -> LLMEngine:
    return LLMEngine(EngineConfig.from_kwargs("tiny-llama", num_kv_blocks=64, max_num_seqs=4))


def test_held_siblings_count_as_waiting_and_counts_stay_exact() -> None:
    engine = tiny_engine()
    engine.add_request("r", [5] * 40, SamplingParams(max_tokens=3, n=5, ignore_eos=True))
    assert engine._held  # the siblings wait for the first child's prompt blocks
    assert engine.stats()["num_waiting"] == 5
    while engine.has_unfinished_requests():
        engine.step()
        s = engine.stats()
        assert s["num_waiting"] >= 0
        unfinished = sum(not r.is_finished for r in engine.requests.values())
        assert s["num_running"] + s["num_waiting"] == unfinished


def test_not_running_counts_each_sequence_from_the_inbox_into_the_engine() -> None:
    async_engine = AsyncLLMEngine(tiny_engine())  # its thread not started: we step it here
    params = SamplingParams(max_tokens=2, n=3, ignore_eos=True)
    stream = async_engine.generate("a", [5] * 40, params)
    async_engine.generate("b", [6] * 8, SamplingParams(max_tokens=2))
    assert async_engine.num_not_running == 4  # in the inbox: 3 + 1
    async_engine._take_inbox()
    assert async_engine.num_not_running == 4  # in the engine now (2 of them held)
    seen = []
    engine = async_engine.engine
    while engine.has_unfinished_requests():
        engine.step()
        async_engine.stats = engine.stats()
        seen.append(async_engine.num_not_running)
    assert min(seen) == 0 and seen == sorted(seen, reverse=True)
    asyncio.new_event_loop().run_until_complete(stream.aclose())


@pytest.fixture(scope="module")
def client() -> Iterator[tuple[TestClient, asyncio.AbstractEventLoop]]:
    loop = asyncio.new_event_loop()
    app = build_app(AsyncLLMEngine(tiny_engine()), "tiny-llama", max_queue=4)
    c = TestClient(TestServer(app), loop=loop)
    loop.run_until_complete(c.start_server())
    yield c, loop
    loop.run_until_complete(c.close())
    loop.close()


def post(client: Any, body: dict[str, Any]) -> tuple[int, Any]:
    c, loop = client

    async def go() -> tuple[int, Any]:
        async with c.post("/v1/completions", json=body) as r:
            return r.status, await r.json()

    return loop.run_until_complete(go())


def test_max_queue_counts_sequences_not_prompts(
    client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    body = {"prompt": [5, 6], "max_tokens": 2}
    status, answer = post(client, {**body, "n": 256})
    assert status == 400 and answer["error"]["param"] == "n", answer
    assert (
        "256 sequences" in answer["error"]["message"] and "at most 4" in answer["error"]["message"]
    )
    status, answer = post(client, {**body, "prompt": [[5, 6]] * 2, "n": 3})
    assert status == 400, answer  # 6 sequences can never fit in 4
    state = next(v for v in client[0].server.app.values() if isinstance(v, ServerState))
    rejected = state.rejected_total
    monkeypatch.setattr(AsyncLLMEngine, "num_not_running", property(lambda self: 2))
    status, answer = post(client, {**body, "n": 3})
    assert status == 429 and answer["error"]["type"] == "rate_limit_error", answer  # 2 + 3 > 4
    assert "sequences" in answer["error"]["message"] and state.rejected_total == rejected + 1
    status, answer = post(client, {**body, "n": 2})
    assert status == 200 and len(answer["choices"]) == 2, answer


def test_sampling_extensions_are_served_and_bias_past_the_vocabulary_is_a_400(
    client: Any,
) -> None:
    body = {"prompt": [5, 6], "max_tokens": 4, "temperature": 0, "ignore_eos": True}
    status, plain = post(client, body)
    assert status == 200, plain
    extras = {"min_tokens": 2, "presence_penalty": 1.0, "repetition_penalty": 1.2, "min_p": 0.1}
    status, answer = post(client, {**body, **extras})
    assert status == 200 and answer["usage"]["completion_tokens"] == 4, answer
    vocab = client[0].server.app[ENGINE_KEY].engine.model_config.vocab_size
    status, answer = post(client, {**body, "logit_bias": {str(vocab): 1}})
    assert status == 400 and answer["error"]["param"] == "logit_bias", answer
