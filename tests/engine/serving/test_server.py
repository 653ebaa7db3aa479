"""`bench serve` end to end, as a real process on a loopback port: it answers the official
openai client exactly like the offline engine, refuses bad input with OpenAI-style 4xx errors
(never a 500), frees what a departed client held, serves many clients at once, refuses work
beyond its queue, checks API keys, exposes Prometheus metrics, and exits 0 on SIGTERM."""

from __future__ import annotations

import asyncio
import http.client
import json
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from unittest.mock import ANY

import aiohttp
import openai
import pytest

from bench_cli.local_server import free_port
from engine import LLM, SamplingParams

SMOL = "smollm2-135m"
TINY = "tiny-llama"  # random weights, vocab 512, no tokenizer, context 1024
# Servers whose tests check HTTP, admission and keys, not what is computed: their start skips
# torch.compile (tens of seconds a start on a busy 2-core machine).
EAGER = "--enforce-eager"
SMOL_CONTEXT = 8192
STARTUP_S = 120.0
SHUTDOWN_S = 20.0
REQUEST_TIMEOUT = aiohttp.ClientTimeout(total=120)
COMPLETION_PROMPT = "The capital of France is"
CHAT_MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]

slow = pytest.mark.slow  # loads the real SmolLM2 model


# ---- a server process ---------------------------------------------------------------------


@dataclass
class Server:
    proc: subprocess.Popen[bytes]
    port: int
    log: Path
    healthy: bool = False

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log_tail(self, n: int = 40) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])

    def wait_healthy(self) -> None:
        deadline = time.monotonic() + STARTUP_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                pytest.fail(f"the server exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                if http_request(self, "GET", "/health", timeout=2).status == 200:
                    self.healthy = True
                    return
            except OSError:
                pass
            time.sleep(0.25)
        pytest.fail(f"the server was not healthy within {STARTUP_S} s:\n{self.log_tail()}")


def bench_executable() -> str:
    found = Path(sys.executable).parent / "bench"
    return str(found) if found.exists() else shutil.which("bench") or "bench"


@contextmanager
def bench_serve(tmp: Path, *args: str) -> Iterator[Server]:
    """Start `bench serve ARGS`; on exit, SIGTERM must end it with code 0 (graceful shutdown)."""
    port = free_port()
    log = tmp / "server.log"
    cmd = [bench_executable(), "serve", "--host", "127.0.0.1", "--port", str(port), *args]
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
    server = Server(proc, port, log)
    try:
        yield server
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    if not server.healthy:  # it never started: that failure is reported already
        proc.kill()
        proc.wait()
        return
    proc.send_signal(signal.SIGTERM)
    try:
        code = proc.wait(timeout=SHUTDOWN_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        pytest.fail(f"SIGTERM did not stop the server in {SHUTDOWN_S} s:\n{server.log_tail()}")
    assert code == 0, f"the server exited with {code} on SIGTERM:\n{server.log_tail()}"


@pytest.fixture(scope="module")
def smol_process(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("smol")
    with bench_serve(tmp, "--model", SMOL, "--dtype", "float32", "--max-num-seqs", "16") as s:
        yield s


@pytest.fixture(scope="module")
def llm(smol_process: Server) -> LLM:
    """The offline engine, loaded while the server process starts (same weights cache)."""
    return LLM(SMOL, dtype="float32")


@pytest.fixture(scope="module")
def smol(smol_process: Server) -> Server:
    smol_process.wait_healthy()
    return smol_process


@pytest.fixture(scope="module")
def client(smol: Server) -> Iterator[openai.OpenAI]:
    with client_for(smol) as c:
        yield c


@pytest.fixture(scope="module")
def queue_of_two(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("queue")
    args = ["--model", TINY, "--dtype", "float32", "--max-num-seqs", "1", "--max-queue", "2", EAGER]
    with bench_serve(tmp, *args) as s:
        s.wait_healthy()
        yield s


@pytest.fixture(scope="module")
def keyed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """The key from SERVEBENCH_API_KEY, as vLLM reads VLLM_API_KEY (not visible to `ps`)."""
    tmp = tmp_path_factory.mktemp("keyed")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SERVEBENCH_API_KEY", "secret")
        with bench_serve(tmp, "--model", TINY, "--dtype", "float32", EAGER) as s:
            s.wait_healthy()
            mp.undo()
            yield s


# ---- HTTP helpers -------------------------------------------------------------------------


@dataclass
class Reply:
    status: int
    content_type: str
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


def http_request(
    server: Server,
    method: str,
    path: str,
    body: Any = None,
    headers: dict[str, str] | None = None,
    timeout: float = 60,
) -> Reply:
    """One raw request: a str or bytes body is sent as is, anything else as JSON."""
    if body is not None and not isinstance(body, str | bytes):
        body = json.dumps(body)
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=timeout)
    try:
        hdrs = {"Content-Type": "application/json", **(headers or {})}
        conn.request(method, path, body=body, headers=hdrs)
        resp = conn.getresponse()
        return Reply(resp.status, resp.getheader("Content-Type", ""), resp.read())
    finally:
        conn.close()


def assert_openai_error(reply: Reply, status: int, type_: str) -> dict[str, Any]:
    assert reply.status == status, reply.body[:300]
    assert reply.content_type.startswith("application/json")
    body = reply.json()
    assert set(body) == {"error"}
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert isinstance(error["message"], str) and error["message"]
    assert error["type"] == type_
    return error


def client_for(server: Server, api_key: str = "x") -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=api_key, max_retries=0, timeout=60)


def run_async(coro: Any, timeout: float = 120) -> Any:
    return asyncio.run(asyncio.wait_for(coro, timeout))


async def sse_data(resp: aiohttp.ClientResponse) -> AsyncIterator[str]:
    """The `data:` payloads of a server-sent-event stream, in order."""
    async for line in resp.content:
        if line.startswith(b"data: "):
            yield line[len(b"data: ") :].decode().rstrip("\r\n")


def metrics(server: Server) -> dict[str, float]:
    """Every sample of /metrics by its name with labels, e.g. 'servebench:kv_blocks_used'."""
    reply = http_request(server, "GET", "/metrics")
    assert reply.status == 200
    samples = {}
    for line in reply.body.decode().splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            samples[name] = float(value)
    return samples


def poll(check: Callable[[], bool], timeout_s: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.2)
    return check()


def engine_is_idle(server: Server) -> bool:
    m = metrics(server)
    return (
        m["servebench:num_requests_running"] == 0
        and m["servebench:num_requests_waiting"] == 0
        and m["servebench:kv_blocks_used"] == 0
    )


# ---- the official client against the real model ------------------------------------------


@pytest.fixture(scope="module")
def offline(llm: LLM) -> dict[str, Any]:
    """The offline engine's greedy answers, one request at a time, for both endpoints."""
    tokenizer = llm.get_tokenizer()
    assert tokenizer is not None
    params = SamplingParams(max_tokens=16, temperature=0.0)
    chat_prompt = tokenizer.apply_chat_template(CHAT_MESSAGES)
    return {
        "completion": llm.generate(COMPLETION_PROMPT, params)[0],
        "chat": llm.generate(chat_prompt, params)[0],
    }


@slow
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_completion_matches_the_offline_engine(
    offline: dict[str, Any], client: openai.OpenAI, stream: bool
) -> None:
    expected = offline["completion"]
    kw: dict[str, Any] = {"model": SMOL, "prompt": COMPLETION_PROMPT, "max_tokens": 16}
    if stream:
        chunks = list(
            client.completions.create(
                **kw, temperature=0, stream=True, stream_options={"include_usage": True}
            )
        )
        text = "".join(c.choices[0].text for c in chunks if c.choices)
        finish = [c.choices[0].finish_reason for c in chunks if c.choices][-1]
        usage = chunks[-1].usage
        assert not chunks[-1].choices  # the usage chunk comes last, on its own
    else:
        answer = client.completions.create(**kw, temperature=0)
        text, finish, usage = answer.choices[0].text, answer.choices[0].finish_reason, answer.usage
        assert answer.model == SMOL
    assert text == expected.outputs[0].text
    assert finish == expected.outputs[0].finish_reason
    assert usage is not None
    assert usage.prompt_tokens == len(expected.prompt_token_ids)
    assert usage.completion_tokens == len(expected.outputs[0].token_ids)
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens


@slow
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_chat_matches_the_offline_engine_on_the_templated_prompt(
    offline: dict[str, Any], client: openai.OpenAI, stream: bool
) -> None:
    expected = offline["chat"]
    kw: dict[str, Any] = {"model": SMOL, "messages": CHAT_MESSAGES, "max_tokens": 16}
    if stream:
        chunks = list(
            client.chat.completions.create(
                **kw, temperature=0, stream=True, stream_options={"include_usage": True}
            )
        )
        deltas = [c.choices[0].delta for c in chunks if c.choices]
        assert deltas[0].role == "assistant"
        assert not chunks[-1].choices  # the usage chunk comes last, on its own
        text = "".join(d.content or "" for d in deltas)
        finish = [c.choices[0].finish_reason for c in chunks if c.choices][-1]
        usage = chunks[-1].usage
    else:
        answer = client.chat.completions.create(**kw, temperature=0)
        message = answer.choices[0].message
        assert message.role == "assistant"
        text, finish, usage = message.content, answer.choices[0].finish_reason, answer.usage
    assert text == expected.outputs[0].text
    assert finish == expected.outputs[0].finish_reason
    assert usage is not None
    assert usage.prompt_tokens == len(expected.prompt_token_ids)
    assert usage.completion_tokens == len(expected.outputs[0].token_ids)


@slow
def test_models_list_names_the_served_model(client: openai.OpenAI) -> None:
    assert [m.id for m in client.models.list()] == [SMOL]


# ---- bad requests -------------------------------------------------------------------------

C, CHAT = "/v1/completions", "/v1/chat/completions"
OK = {"prompt": "Hello", "max_tokens": 2}
USER = [{"role": "user", "content": "Hi"}]

# (id, method, path, body, status, param, code); a str or bytes body is sent verbatim.
BAD_REQUESTS: list[tuple[str, str, str, Any, int, Any, Any]] = [
    ("malformed-json", "POST", C, '{"prompt": "Hi",', 400, None, None),
    ("empty-body", "POST", C, "", 400, None, None),
    ("not-utf8", "POST", C, b"\xff\xfe{}", 400, None, None),
    ("json-array-body", "POST", C, '[{"prompt": "Hi"}]', 400, None, None),
    ("max-tokens-string", "POST", C, {**OK, "max_tokens": "a"}, 400, "max_tokens", None),
    ("temperature-string", "POST", C, {**OK, "temperature": "hot"}, 400, "temperature", None),
    ("stream-string", "POST", C, {**OK, "stream": "yes"}, 400, "stream", None),
    ("top-p-bool", "POST", C, {**OK, "top_p": True}, 400, "top_p", None),
    ("stop-int", "POST", C, {**OK, "stop": 5}, 400, "stop", None),
    ("stop-empty-string", "POST", C, {**OK, "stop": ["ok", ""]}, 400, "stop", None),
    ("seed-float", "POST", C, {**OK, "seed": 1.5}, 400, "seed", None),
    ("seed-over-64-bits", "POST", C, {**OK, "seed": 2**70}, 400, "seed", None),
    ("unknown-model", "POST", C, {**OK, "model": "gpt-4o"}, 404, "model", "model_not_found"),
    ("empty-prompt", "POST", C, {**OK, "prompt": ""}, 400, "prompt", None),
    ("empty-prompt-list", "POST", C, {**OK, "prompt": []}, 400, "prompt", None),
    ("mixed-prompt-list", "POST", C, {**OK, "prompt": [1, "a"]}, 400, "prompt", None),
    ("missing-prompt", "POST", C, {"max_tokens": 2}, 400, "prompt", None),
    ("out-of-vocab-token", "POST", C, {**OK, "prompt": [1, 10**9]}, 400, "prompt", None),
    ("negative-token", "POST", C, {**OK, "prompt": [1, -1]}, 400, "prompt", None),
    ("negative-max-tokens", "POST", C, {**OK, "max_tokens": -1}, 400, "max_tokens", None),
    ("zero-max-tokens", "POST", C, {**OK, "max_tokens": 0}, 400, "max_tokens", None),
    (
        "prompt-plus-max-tokens-over-context",
        "POST",
        C,
        {**OK, "max_tokens": SMOL_CONTEXT},
        400,
        "max_tokens",
        "context_length_exceeded",
    ),
    (
        "prompt-longer-than-context",
        "POST",
        C,
        {**OK, "prompt": [1] * (SMOL_CONTEXT + 1)},
        400,
        "prompt",
        "context_length_exceeded",
    ),
    ("temperature-5", "POST", C, {**OK, "temperature": 5}, 400, "temperature", None),
    ("top-p-0", "POST", C, {**OK, "top_p": 0}, 400, "top_p", None),
    ("top-k-minus-5", "POST", C, {**OK, "top_k": -5}, 400, "top_k", None),
    ("n-0", "POST", C, {**OK, "n": 0}, 400, "n", None),
    ("logprobs", "POST", C, {**OK, "logprobs": 1}, 400, "logprobs", None),
    (
        "include-usage-string",
        "POST",
        C,
        {**OK, "stream": True, "stream_options": {"include_usage": "yes"}},
        400,
        "stream_options",
        None,
    ),
    ("missing-messages", "POST", CHAT, {"max_tokens": 2}, 400, "messages", None),
    ("messages-not-a-list", "POST", CHAT, {"messages": "Hi"}, 400, "messages", None),
    (
        "message-bad-role",
        "POST",
        CHAT,
        {"messages": [{"role": "wizard", "content": "Hi"}]},
        400,
        "messages",
        None,
    ),
    (
        "message-content-number",
        "POST",
        CHAT,
        {"messages": [{"role": "user", "content": 5}]},
        400,
        "messages",
        None,
    ),
    ("chat-logprobs", "POST", CHAT, {"messages": USER, "logprobs": True}, 400, "logprobs", None),
    (
        "chat-longer-than-context",
        "POST",
        CHAT,
        {"messages": [{"role": "user", "content": "hi " * SMOL_CONTEXT}]},
        400,
        ANY,
        "context_length_exceeded",
    ),
    ("unknown-path", "GET", "/v1/nothing-here", None, 404, None, None),
    ("wrong-method", "GET", C, None, 405, None, None),
]


@slow
@pytest.mark.parametrize(
    ("method", "path", "body", "status", "param", "code"),
    [pytest.param(*row[1:], id=row[0]) for row in BAD_REQUESTS],
)
def test_bad_request_gets_an_openai_style_4xx(
    smol: Server, method: str, path: str, body: Any, status: int, param: Any, code: Any
) -> None:
    reply = http_request(smol, method, path, body)
    error = assert_openai_error(reply, status, "invalid_request_error")
    assert (error["param"], error["code"]) == (param, code)


@slow
def test_server_still_serves_after_the_bad_requests(smol: Server) -> None:
    assert engine_is_idle(smol)
    reply = http_request(smol, "POST", C, {**OK, "ignore_eos": True})
    assert reply.status == 200
    assert reply.json()["usage"]["completion_tokens"] == 2


@slow
def test_extreme_but_valid_sampling_values_are_served(smol: Server) -> None:
    body = {**OK, "ignore_eos": True, "temperature": 2, "top_k": 2**70, "seed": 2**64 - 1}
    reply = http_request(smol, "POST", C, body)
    assert reply.status == 200, reply.body[:300]
    assert reply.json()["usage"]["completion_tokens"] == 2


# ---- clients that leave, many clients -----------------------------------------------------


@slow
def test_streams_cut_by_their_clients_free_the_engine(smol: Server) -> None:
    body = {"prompt": "Tell me a long story.", "max_tokens": 4000, "ignore_eos": True}

    async def cut_after_three_chunks(session: aiohttp.ClientSession) -> int:
        resp = await session.post(f"{smol.url}{C}", json={**body, "stream": True})
        assert resp.status == 200
        received = 0
        async for _ in sse_data(resp):
            received += 1
            if received == 3:
                break
        resp.close()  # drop the connection mid-stream
        return received

    async def main() -> list[int]:
        async with aiohttp.ClientSession(timeout=REQUEST_TIMEOUT) as session:
            return await asyncio.gather(*(cut_after_three_chunks(session) for _ in range(10)))

    assert run_async(main()) == [3] * 10
    assert poll(lambda: engine_is_idle(smol)), metrics(smol)
    reply = http_request(smol, "POST", C, {**OK, "ignore_eos": True})
    assert reply.status == 200 and reply.json()["usage"]["completion_tokens"] == 2


@slow
def test_sixty_four_concurrent_streams_all_complete_with_exact_usage(
    llm: LLM, smol: Server
) -> None:
    tokenizer = llm.get_tokenizer()
    assert tokenizer is not None
    prompts = [f"Request {i}: count from {i} to {i + 5}:" for i in range(64)]

    async def one(session: aiohttp.ClientSession, prompt: str) -> tuple[dict[str, Any], str]:
        body = {
            "prompt": prompt,
            "max_tokens": 8,
            "ignore_eos": True,
            "temperature": 0,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        async with session.post(f"{smol.url}{C}", json=body) as resp:
            assert resp.status == 200
            events = [e async for e in sse_data(resp)]
        assert events[-1] == "[DONE]"
        chunks = [json.loads(e) for e in events[:-1]]
        finish = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1]
        return chunks[-1]["usage"], finish

    async def main() -> list[tuple[dict[str, Any], str]]:
        async with aiohttp.ClientSession(timeout=REQUEST_TIMEOUT) as session:
            return await asyncio.gather(*(one(session, p) for p in prompts))

    results = run_async(main())
    for prompt, (usage, finish) in zip(prompts, results, strict=True):
        assert usage["prompt_tokens"] == len(tokenizer.encode(prompt))
        assert usage["completion_tokens"] == 8
        assert finish == "length"
    assert engine_is_idle(smol)


# ---- metrics ------------------------------------------------------------------------------

SAMPLE_LINE = re.compile(r'^[a-zA-Z_:][a-zA-Z0-9_:]*(\{[a-z_]+="[^"]*"(,[a-z_]+="[^"]*")*\})? \S+$')


@slow
def test_metrics_are_prometheus_text_with_gauges_histograms_and_config(smol: Server) -> None:
    reply = http_request(smol, "GET", "/metrics")
    assert reply.status == 200 and reply.content_type.startswith("text/plain")
    lines = reply.body.decode().splitlines()
    for line in lines:
        assert line.startswith(("# HELP ", "# TYPE ")) or SAMPLE_LINE.match(line), line
    typed = {line.split()[2]: line.split()[3] for line in lines if line.startswith("# TYPE ")}
    assert typed["servebench:step_time_seconds"] == "histogram"
    assert typed["servebench:time_to_first_token_seconds"] == "histogram"
    assert typed["servebench:kv_blocks_total"] == "gauge"
    assert typed["servebench:generation_tokens_total"] == "counter"
    m = metrics(smol)
    assert (
        m['servebench:step_time_seconds_bucket{le="+Inf"}']
        == m["servebench:step_time_seconds_count"]
    )
    assert "servebench:time_to_first_token_seconds_count" in m
    assert m["servebench:kv_blocks_total"] > 0
    config = [k for k in m if k.startswith("servebench:config{")]
    assert len(config) == 1 and m[config[0]] == 1
    assert f'model="{SMOL}"' in config[0] and 'max_num_seqs="16"' in config[0]


@slow
def test_metrics_counters_grow_with_a_streamed_request(smol: Server) -> None:
    before = metrics(smol)
    prompt = [1, 2, 3, 4, 5]
    body = {"prompt": prompt, "max_tokens": 6, "ignore_eos": True, "stream": True}
    reply = http_request(smol, "POST", C, body)
    assert reply.status == 200 and reply.body.rstrip().endswith(b"data: [DONE]")
    after = metrics(smol)

    def grew(name: str) -> float:
        return after[f"servebench:{name}"] - before[f"servebench:{name}"]

    assert grew("requests_total") == 1
    assert grew("prompt_tokens_total") == len(prompt)
    assert grew("generation_tokens_total") == 6
    assert grew("time_to_first_token_seconds_count") == 1
    assert grew("step_time_seconds_count") >= 6
    assert grew("requests_rejected_total") == 0


# ---- admission control and API keys (tiny random model) -----------------------------------


def test_requests_beyond_the_queue_get_429_while_health_and_accepted_ones_go_on(
    queue_of_two: Server,
) -> None:
    server = queue_of_two
    body = {"prompt": [5, 6, 7], "max_tokens": 500, "ignore_eos": True}

    async def post(session: aiohttp.ClientSession) -> tuple[int, Any]:
        async with session.post(f"{server.url}{C}", json=body) as resp:
            return resp.status, await resp.json()

    async def main() -> tuple[list[tuple[int, Any]], int, bool]:
        async with aiohttp.ClientSession(timeout=REQUEST_TIMEOUT) as session:
            tasks = [asyncio.create_task(post(session)) for _ in range(12)]
            first_status, _ = await next(asyncio.as_completed(tasks))
            async with session.get(f"{server.url}/health") as resp:
                health = resp.status
            accepted_still_running = not all(t.done() for t in tasks)
            assert first_status == 429  # refused at once, before any accepted one finished
            return await asyncio.gather(*tasks), health, accepted_still_running

    results, health, accepted_still_running = run_async(main())
    assert health == 200 and accepted_still_running
    accepted = [answer for status, answer in results if status == 200]
    refused = [answer for status, answer in results if status == 429]
    assert len(accepted) + len(refused) == 12
    assert 1 <= len(accepted) <= 1 + 2  # max_num_seqs running + max_queue waiting
    for answer in accepted:
        assert answer["usage"]["completion_tokens"] == 500
        assert answer["choices"][0]["finish_reason"] == "length"
    for answer in refused:
        error = answer["error"]
        assert set(error) == {"message", "type", "param", "code"}
        assert error["type"] == "rate_limit_error"
    assert metrics(server)["servebench:requests_rejected_total"] == len(refused)
    assert engine_is_idle(server)


@pytest.mark.parametrize(
    "headers",
    [{}, {"Authorization": "Bearer wrong"}, {"Authorization": "secret"}],
    ids=["no-key", "wrong-key", "not-bearer"],
)
@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("GET", "/v1/models", None),
        ("POST", C, {"prompt": [5, 6], "max_tokens": 2}),
        ("GET", "/v1/no-such-route", None),  # as vLLM: not probed without the key
    ],
    ids=["models", "completions", "unknown-v1-path"],
)
def test_v1_without_the_right_key_gets_401(
    keyed: Server, headers: dict[str, str], method: str, path: str, body: Any
) -> None:
    reply = http_request(keyed, method, path, body, headers=headers)
    assert_openai_error(reply, 401, "authentication_error")


def test_the_right_key_is_served_and_health_and_metrics_need_none(keyed: Server) -> None:
    auth = {"Authorization": "Bearer secret"}
    body = {"prompt": [5, 6], "max_tokens": 2, "ignore_eos": True}
    reply = http_request(keyed, "POST", C, body, headers=auth)
    assert reply.status == 200 and reply.json()["usage"]["completion_tokens"] == 2
    with client_for(keyed, api_key="secret") as client:
        assert [m.id for m in client.models.list()] == [TINY]
    with client_for(keyed, api_key="wrong") as client, pytest.raises(openai.AuthenticationError):
        client.models.list()
    assert http_request(keyed, "GET", "/health").status == 200
    assert http_request(keyed, "GET", "/metrics").status == 200
    assert http_request(keyed, "GET", "/version").json()["version"]  # vLLM's path, no key


def test_a_benchmark_detects_this_server_and_its_version(keyed: Server) -> None:
    from loadgen.server_info import detect_server

    info = detect_server(f"http://127.0.0.1:{keyed.port}/v1", TINY, api_key="secret")
    assert info.kind == "servebench" and info.version not in (None, "unknown")


def test_the_openai_client_gets_n_choices_priority_and_cached_tokens(
    client: openai.OpenAI, llm: LLM
) -> None:
    """n as the OpenAI field, priority through extra_body (vLLM's field), and the prefix
    cache's share of the prompt in usage.prompt_tokens_details.cached_tokens."""
    prompt = "Write a haiku about the sea, with a title, in English, please:"
    kw = {"model": SMOL, "prompt": prompt, "max_tokens": 6, "temperature": 0.0}
    first = client.completions.create(n=3, extra_body={"priority": 1}, **kw)
    assert [c.index for c in first.choices] == [0, 1, 2]
    assert len({c.text for c in first.choices}) == 1  # greedy: three equal completions
    expected = llm.generate(prompt, SamplingParams(max_tokens=6, temperature=0.0))[0]
    assert first.choices[0].text == expected.outputs[0].text
    assert first.usage.completion_tokens == 18
    assert first.usage.prompt_tokens == len(expected.prompt_token_ids)  # counted once
    chunks = client.completions.create(n=2, stream=True, **kw)
    indices = {c.choices[0].index for c in chunks if c.choices}
    assert indices == {0, 1}
    again = client.completions.create(**kw)
    assert again.usage.prompt_tokens_details.cached_tokens == (
        (again.usage.prompt_tokens - 1) // 16 * 16
    )


# ---- speculative decoding (tiny random model) ----------------------------------------------


def test_speculative_decoding_streams_the_same_text_and_exports_its_counters(
    tmp_path: Path,
) -> None:
    """--speculative-config as vLLM takes it: the streamed greedy text equals the offline
    engine's without speculation, accepted drafts share their step's chunk, and /metrics
    carries vLLM's spec-decode counters (per position too) and the config label."""
    model = "tiny-smollm2"  # random weights behind SmolLM2's tokenizer: text to stream
    spec = '{"method": "draft_layers", "num_speculative_tokens": 3, "num_draft_layers": 1}'
    prompt = [(7 * k) % 300 + 300 for k in range(40)]
    params = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)
    want = LLM(model).generate([prompt], params)[0].outputs[0]
    with bench_serve(tmp_path, "--model", model, "--speculative-config", spec) as server:
        server.wait_healthy()
        body = {"prompt": prompt, "max_tokens": 40, "temperature": 0, "stream": True,
                "ignore_eos": True, "stream_options": {"include_usage": True}}  # fmt: skip
        reply = http_request(server, "POST", C, body)
        m = metrics(server)
        config = http_request(server, "GET", "/v1/engine/config").json()
    assert reply.status == 200
    events = [json.loads(line[6:]) for line in reply.body.decode().splitlines()
              if line.startswith("data: {")]  # fmt: skip
    texts = [c["text"] for e in events for c in e["choices"] if c["text"]]
    assert "".join(texts) == want.text
    assert events[-1]["usage"]["completion_tokens"] == 40
    drafts = m["servebench:spec_decode_num_drafts_total"]
    accepted = m["servebench:spec_decode_num_accepted_tokens_total"]
    assert 0 < accepted <= m["servebench:spec_decode_num_draft_tokens_total"] <= 3 * drafts
    per_pos = [m[f'servebench:spec_decode_num_accepted_tokens_per_pos_total{{position="{i}"}}']
               for i in range(3)]  # fmt: skip
    assert sum(per_pos) == accepted
    assert len(texts) < 40  # a step's accepted drafts arrive in one chunk
    assert config["engine"]["speculative_config"]["method"] == "draft_layers"
    assert config["cpu_threads"] and config["cpu_pool_threads"] >= 1  # engine/kernel_pool.py
    label = next(k for k in m if k.startswith("servebench:config{"))
    assert "draft_layers" in label


def test_a_bad_speculative_config_stops_the_server_with_a_clear_error(tmp_path: Path) -> None:
    with bench_serve(tmp_path, "--model", TINY, "--speculative-config", '{"method": "x"}') as s:
        code = s.proc.wait(timeout=120)
        assert code != 0
        assert "method must be one of ngram, draft_layers" in s.log_tail()
