"""The request parser and the HTTP handlers turn any JSON body into a result or a 4xx:
never a 500. Handlers run in-process on the tiny random model."""

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.config import EngineConfig
from engine.engine import LLMEngine
from engine.serving.async_engine import AsyncLLMEngine
from engine.serving.protocol import APIError, parse_common, parse_completion, parse_messages
from engine.serving.server import build_app

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**40), 2**40)
    | st.floats(allow_nan=False)
    | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=12,
)
FIELDS = [
    "prompt",
    "messages",
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "top_p",
    "top_k",
    "seed",
    "stop",
    "stop_token_ids",
    "n",
    "stream",
    "stream_options",
    "logprobs",
    "ignore_eos",
    "model",
]
bodies = st.dictionaries(st.sampled_from(FIELDS), json_values, max_size=8)


@settings(max_examples=400, deadline=None)
@given(body=bodies)
def test_parser_answers_any_body_with_a_request_or_a_4xx(body: dict[str, Any]) -> None:
    for parse in (
        parse_completion,
        lambda b: parse_common(b, [parse_messages(b)[0]["content"]], True),
    ):
        try:
            parse(body)
        except APIError as e:
            assert 400 <= e.status < 500 and e.message


@pytest.fixture(scope="module")
def client() -> Iterator[tuple[TestClient, asyncio.AbstractEventLoop]]:
    loop = asyncio.new_event_loop()
    engine = LLMEngine(EngineConfig.from_kwargs("tiny-llama", num_kv_blocks=64, max_num_seqs=4))
    app = build_app(AsyncLLMEngine(engine), "tiny-llama")
    c = TestClient(TestServer(app), loop=loop)
    loop.run_until_complete(c.start_server())
    yield c, loop
    loop.run_until_complete(c.close())
    loop.close()


def post(
    client: tuple[TestClient, asyncio.AbstractEventLoop], path: str, body: Any
) -> tuple[int, Any]:
    c, loop = client

    async def go() -> tuple[int, Any]:
        data = body if isinstance(body, str) else json.dumps(body)
        async with c.post(path, data=data) as r:
            text = await r.text()
            if r.content_type == "application/json":
                return r.status, json.loads(text)
            return r.status, text

    return loop.run_until_complete(go())


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(body=bodies, chat=st.booleans())
def test_handlers_never_answer_500(client: Any, body: dict[str, Any], chat: bool) -> None:
    body.pop("stream", None)  # streamed answers are covered by the server tests
    if "max_tokens" in body and isinstance(body["max_tokens"], int) and body["max_tokens"] > 4:
        body["max_tokens"] = 4  # keep generations short
    status, answer = post(client, "/v1/chat/completions" if chat else "/v1/completions", body)
    assert status < 500, answer
    if status >= 400:
        assert set(answer["error"]) == {"message", "type", "param", "code"}


def test_token_id_prompt_is_served(client: Any) -> None:
    status, answer = post(
        client, "/v1/completions", {"prompt": [5, 6, 7], "max_tokens": 3, "ignore_eos": True}
    )
    assert status == 200
    assert answer["usage"] == {"prompt_tokens": 3, "completion_tokens": 3, "total_tokens": 6}


def test_a_failing_step_fails_its_requests_and_the_server_keeps_serving(
    client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    c, _ = client
    engine = next(v for k, v in c.server.app.items() if isinstance(v, AsyncLLMEngine)).engine
    real = engine.runner.execute
    calls = {"n": 0}

    def flaky(*args: Any, **kwargs: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("injected fault")
        return real(*args, **kwargs)

    monkeypatch.setattr(engine.runner, "execute", flaky)
    status, answer = post(client, "/v1/completions", {"prompt": [5, 6], "max_tokens": 2})
    assert status == 500 and "injected fault" in answer["error"]["message"]
    status, answer = post(
        client, "/v1/completions", {"prompt": [5, 6], "max_tokens": 2, "ignore_eos": True}
    )
    assert status == 200 and answer["usage"]["completion_tokens"] == 2
    assert engine.stats()["kv_blocks_used"] == 0
