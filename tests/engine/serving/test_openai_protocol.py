"""The request parser and the HTTP handlers turn any JSON body into a result or a 4xx:
never a 500. Handlers run in-process on the tiny random model."""

import asyncio
import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.config import EngineConfig
from engine.core.request import SamplingParams
from engine.engine import LLMEngine
from engine.serving.app_state import ServerState
from engine.serving.async_engine import AsyncLLMEngine, EngineStepError
from engine.serving.protocol import APIError, parse_common, parse_completion, parse_messages
from engine.serving.server import build_app

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**40), 2**40)
    | st.integers(-(10**500), 10**500)  # past a float's range
    | st.floats()  # NaN and +-Infinity too: Python's json reads them
    | st.text(max_size=8)
    | st.text(st.characters(categories=["Cs", "Lu", "Nd"]), max_size=4),  # lone surrogates
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
    "priority",
    "stream",
    "stream_options",
    "logprobs",
    "ignore_eos",
    "model",
    "logit_bias",
    "min_tokens",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "min_p",
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
    # A tiny random model with SmolLM2's tokenizer and chat template: both endpoints serve.
    config = EngineConfig.from_kwargs("tiny-smollm2", num_kv_blocks=64, max_num_seqs=4)
    app = build_app(AsyncLLMEngine(LLMEngine(config)), "tiny-smollm2")
    c = TestClient(TestServer(app), loop=loop)
    loop.run_until_complete(c.start_server())
    yield c, loop
    loop.run_until_complete(c.close())
    loop.close()


def post(
    client: tuple[TestClient, asyncio.AbstractEventLoop],
    path: str,
    body: Any,
    content_type: str = "application/json",
) -> tuple[int, Any]:
    """POST a body (a str is sent verbatim); the status and the parsed answer."""
    c, loop = client

    async def go() -> tuple[int, Any]:
        data = body if isinstance(body, str) else json.dumps(body)
        async with c.post(path, data=data, headers={"Content-Type": content_type}) as r:
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


# Raw JSON texts that Python's parser or arithmetic choke on: integers past the 4,300-digit
# string limit or a float's range, NaN and infinities, nesting past the recursion limit.
absurd_json = st.one_of(
    st.integers(300, 6000).map(lambda n: "9" * n),
    st.integers(300, 6000).map(lambda n: "-" + "1" * n),
    st.sampled_from(["NaN", "Infinity", "-Infinity", "1e400", "-1e400", "1e-400", "0.5e99999"]),
    st.integers(1, 200_000).map(lambda n: "[" * n + "]" * n),
    st.integers(1, 200_000).map(lambda n: '{"a":' * n + "1" + "}" * n),
    st.integers(1, 200_000).map(lambda n: "[" * n),
    json_values.map(json.dumps),
)
CHARSETS = ["", "; charset=utf-8", "; charset=bogus", "; charset=latin-1", "; charset=utf-16"]


@settings(
    max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    name=st.sampled_from([f for f in FIELDS if f != "stream"]),
    value=absurd_json,
    chat=st.booleans(),
    charset=st.sampled_from(CHARSETS),
)
def test_absurd_numbers_nesting_and_charsets_get_a_4xx(
    client: Any, name: str, value: str, chat: bool, charset: str
) -> None:
    base = '{"prompt": [5, 6], "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2'
    body = f'{base}, "{name}": {value}}}'  # the field named last wins over the defaults
    path = "/v1/chat/completions" if chat else "/v1/completions"
    status, answer = post(client, path, body, "application/json" + charset)
    assert status < 500, answer
    if status >= 400:
        assert set(answer["error"]) == {"message", "type", "param", "code"}


@pytest.mark.parametrize(
    ("body", "charset", "param"),
    [
        ('{"prompt": "Hi", "temperature": 1' + "0" * 400 + "}", "", "temperature"),
        ('{"prompt": "Hi", "top_p": 1' + "0" * 400 + "}", "", "top_p"),
        ('{"prompt": "Hi", "max_tokens": 1' + "0" * 5000 + "}", "", None),
        ("[" * 100_000, "", None),
        ('{"prompt": "Hi", "max_tokens": 2, "temperature": NaN}', "", "temperature"),
        ('{"prompt": "Hi\\ud800", "max_tokens": 2}', "", "prompt"),
        ('{"messages": [{"role": "user", "content": "\\udfff"}]}', "", "messages"),
    ],
    ids=[
        "temperature-400-digits",
        "top-p-400-digits",
        "max-tokens-5000-digits",
        "nesting-100000",
        "temperature-nan",
        "prompt-lone-surrogate",
        "chat-lone-surrogate",
    ],
)
def test_the_bodies_that_once_got_a_500_get_a_400(
    client: Any, body: str, charset: str, param: str | None
) -> None:
    path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
    status, answer = post(client, path, body, "application/json" + charset)
    assert status == 400, answer
    assert answer["error"]["param"] == param
    assert "sys." not in answer["error"]["message"]  # no hint about Python internals


def test_the_charset_header_does_not_matter_json_is_utf8(client: Any) -> None:
    body = {"prompt": "Hi", "max_tokens": 2, "ignore_eos": True}
    for charset in CHARSETS:
        status, answer = post(client, "/v1/completions", body, "application/json" + charset)
        assert status == 200, (charset, answer)


def test_an_unknown_model_gets_404_model_not_found(client: Any) -> None:
    status, answer = post(client, "/v1/completions", {"prompt": "Hi", "model": "gpt-4o"})
    assert status == 404
    assert (answer["error"]["code"], answer["error"]["param"]) == ("model_not_found", "model")


def test_token_id_prompt_is_served(client: Any) -> None:
    status, answer = post(
        client, "/v1/completions", {"prompt": [5, 6, 7], "max_tokens": 3, "ignore_eos": True}
    )
    assert status == 200
    assert answer["usage"] == {
        "prompt_tokens": 3,
        "completion_tokens": 3,
        "total_tokens": 6,
        "prompt_tokens_details": {"cached_tokens": 0},
    }


def test_usage_and_metrics_report_the_prefix_cache(client: Any) -> None:
    """A prompt seen before is served from the cache but for its last block (usage says how
    many prompt tokens, as vLLM and OpenAI do); /metrics counts lookups and hits."""
    body = {"prompt": list(range(10, 60)), "max_tokens": 2, "ignore_eos": True}
    _, first = post(client, "/v1/completions", body)
    _, again = post(client, "/v1/completions", body)
    assert first["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}
    assert again["usage"]["prompt_tokens_details"] == {"cached_tokens": 48}
    c, loop = client
    page = loop.run_until_complete(_text(c, "/metrics"))
    values = dict(line.rsplit(" ", 1) for line in page.splitlines() if line[0] != "#")
    assert float(values["servebench:prefix_cache_hits_total"]) >= 48
    assert float(values["servebench:prefix_cache_queries_total"]) >= 100


async def _text(c: Any, path: str) -> str:
    resp = await c.get(path)
    return await resp.text()


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


def test_max_queue_counts_every_prompt_of_a_request(
    client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    c, _ = client
    state = next(v for v in c.server.app.values() if isinstance(v, ServerState))
    monkeypatch.setattr(state, "max_queue", 4)
    monkeypatch.setattr(AsyncLLMEngine, "num_not_running", property(lambda self: 3))
    body = {"prompt": [[5, 6], [7, 8]], "max_tokens": 2}
    status, answer = post(client, "/v1/completions", body)
    assert status == 429, answer  # 3 waiting + 2 new > 4
    status, answer = post(client, "/v1/completions", {**body, "prompt": [[5, 6]] * 5})
    assert status == 400 and "at most 4" in answer["error"]["message"]  # could never fit
    status, _ = post(client, "/v1/completions", {**body, "prompt": [[5, 6]]})
    assert status == 200


def test_chat_prompts_get_the_templates_bos_only(
    client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    c, _ = client
    tokenizer = next(v for v in c.server.app.values() if isinstance(v, AsyncLLMEngine)).engine
    tokenizer = tokenizer.tokenizer
    bos = tokenizer.eos_token_ids[0]
    monkeypatch.setattr(tokenizer, "bos_token_id", bos)
    monkeypatch.setattr(tokenizer, "add_bos", True)
    monkeypatch.setattr(tokenizer, "chat_template", "{{ bos_token }}" + tokenizer.chat_template)
    messages = [{"role": "user", "content": "Hi"}]
    status, answer = post(client, "/v1/chat/completions", {"messages": messages, "max_tokens": 1})
    assert status == 200, answer
    ids = tokenizer.encode_chat(messages)
    assert ids[:2] == [bos, ids[1]] and ids[1] != bos
    assert answer["usage"]["prompt_tokens"] == len(ids)


def test_metrics_export_the_process_memory_and_the_one_waiting_count(client: Any) -> None:
    from loadgen.telemetry import parse_gauges

    c, loop = client
    engine = next(v for v in c.server.app.values() if isinstance(v, AsyncLLMEngine)).engine

    async def get() -> str:
        async with c.get("/metrics") as r:
            return await r.text()

    text = loop.run_until_complete(get())
    gauges = parse_gauges(text)
    assert gauges["rss_bytes"] > 10 * 2**20
    assert gauges["waiting"] == engine.stats()["num_waiting"]
    assert "# TYPE process_resident_memory_bytes gauge" in text
    assert "process_cpu_seconds_total" in text


def test_requests_a_failing_step_had_finished_still_get_their_output(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    engine = LLMEngine(EngineConfig.from_kwargs("tiny-llama", num_kv_blocks=32, max_num_seqs=4))
    real = engine._process_token

    def fails_on_b(req: Any, token: int) -> None:
        if req.request_id == "b":
            raise RuntimeError("injected fault")
        real(req, token)

    monkeypatch.setattr(engine, "_process_token", fails_on_b)

    async def main() -> tuple[Any, Any]:
        async_engine = AsyncLLMEngine(engine)
        await async_engine.start()
        try:
            params = SamplingParams(max_tokens=1, ignore_eos=True)
            a = async_engine.generate("a", [5, 6], params)  # finishes in the step b fails
            b = async_engine.generate("b", [7, 8], SamplingParams(max_tokens=5))

            async def last(stream: Any) -> Any:
                out = None
                async for out in stream:  # noqa: B007
                    pass
                return out

            return await asyncio.wait_for(
                asyncio.gather(last(a), last(b), return_exceptions=True), 30
            )
        finally:
            await async_engine.stop()

    loop = asyncio.new_event_loop()
    try:
        out_a, out_b = loop.run_until_complete(main())
    finally:
        loop.close()
    assert out_a.finished and out_a.outputs[0].token_ids and out_a.error is None
    assert isinstance(out_b, EngineStepError) and "injected fault" in str(out_b)
    assert engine.kv.num_used_blocks == 0 and not engine.has_unfinished_requests()


def _app_tokenizer(client: Any) -> Any:
    c, _ = client
    return next(v for v in c.server.app.values() if isinstance(v, AsyncLLMEngine)).engine.tokenizer


def test_a_prompt_too_long_by_its_length_alone_is_refused_untokenized(
    client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    tokenizer = _app_tokenizer(client)

    def never(*args: Any, **kwargs: Any) -> list[int]:
        raise AssertionError("tokenized a prompt that could never fit")

    monkeypatch.setattr(tokenizer, "encode", never)
    monkeypatch.setattr(tokenizer, "encode_chat", never)
    huge = "x" * (4 * 2**20)
    for path, body in (
        ("/v1/completions", {"prompt": huge, "max_tokens": 1}),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": huge}]}),
    ):
        status, answer = post(client, path, body)
        assert status == 400 and answer["error"]["code"] == "context_length_exceeded", answer


def test_long_prompts_are_tokenized_off_the_event_loop(
    client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    tokenizer = _app_tokenizer(client)
    threads: list[int] = []
    real_encode, real_chat = tokenizer.encode, tokenizer.encode_chat

    def encode(*args: Any, **kwargs: Any) -> list[int]:
        threads.append(threading.get_ident())
        return real_encode(*args, **kwargs)

    def encode_chat(*args: Any, **kwargs: Any) -> list[int]:
        threads.append(threading.get_ident())
        return real_chat(*args, **kwargs)

    monkeypatch.setattr(tokenizer, "encode", encode)
    monkeypatch.setattr(tokenizer, "encode_chat", encode_chat)
    long = "word " * 4000  # 20,000 characters: past LONG_TEXT_CHARS, within the bound
    post(client, "/v1/completions", {"prompt": long, "max_tokens": 1})
    post(client, "/v1/chat/completions", {"messages": [{"role": "user", "content": long}]})
    post(client, "/v1/completions", {"prompt": "short", "max_tokens": 1})
    loop_thread = threading.get_ident()  # the test client runs the server's loop here
    assert len(threads) >= 3
    assert threads[0] != loop_thread and threads[1] != loop_thread
    assert threads[-1] == loop_thread  # short prompts skip the thread hop


def test_the_length_bound_never_exceeds_the_true_token_count(client: Any) -> None:
    tokenizer = _app_tokenizer(client)
    for text in ["a" * 5000, " " * 3000, "日本語" * 700, "<|im_start|>" * 100, "\n\n\t " * 900]:
        assert tokenizer.min_num_tokens(len(text)) <= len(tokenizer.encode(text, False))


def test_an_error_mid_stream_ends_the_stream_with_an_error_event(
    client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from engine.serving import streaming

    def broken(outputs: Any) -> Any:
        raise KeyError("injected")

    monkeypatch.setattr(streaming, "usage", broken)  # runs after the last token
    body = {"prompt": [5, 6], "max_tokens": 2, "stream": True}
    status, text = post(
        client, "/v1/completions", {**body, "stream_options": {"include_usage": True}}
    )
    assert status == 200
    events = [line[6:] for line in text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    assert json.loads(events[-2])["error"]["type"] == "server_error"


def test_metric_labels_are_escaped() -> None:
    from engine.serving.metrics import Histogram, render_page

    page = render_page({}, {"h": (Histogram(), "x")}, {"model": 'a"b\\c\nd'})
    assert 'model="a\\"b\\\\c\\nd"' in page


def test_every_streamed_choice_of_n_ends_with_its_finish_reason(client: Any) -> None:
    """With n > 1 a completion can end while a sibling has not: its own last chunk carries
    its finish_reason (once only the last sibling's did)."""
    body = {"prompt": [5, 6, 7], "max_tokens": 3, "n": 3, "ignore_eos": True, "stream": True}
    status, text = post(client, "/v1/completions", body)
    assert status == 200
    events = [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: {")]
    reasons = {c["index"]: c["finish_reason"] for e in events for c in e["choices"]}
    ends = [c["index"] for e in events for c in e["choices"] if c["finish_reason"]]
    assert reasons == {0: "length", 1: "length", 2: "length"} and sorted(ends) == [0, 1, 2]
