"""`bench serve` against hostile clients: every request field with extreme values, broken
compressed bodies, bodies too large, too slow or never finished, many uploads at once, clients
that abort or half-close n > 1 streams, and API-key handling. Each gets a 4xx with an
OpenAI-style body or a correct answer, never a 500 or a traceback in the log; /health keeps
answering and the engine's KV blocks go back to zero. One tiny-model server for the module."""

from __future__ import annotations

import asyncio
import gzip
import json
import os
import socket
import subprocess
import time
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import torch

from bench_cli.local_server import free_port
from engine.core.request import SamplingParams
from engine.sampler import probabilities
from engine.serving import guard
from engine.serving.limits import API_KEY_ENV, ServerLimits
from tests.engine.serving.test_server import (
    EAGER,
    TINY,
    Reply,
    Server,
    assert_openai_error,
    bench_executable,
    bench_serve,
    engine_is_idle,
    http_request,
    metrics,
    poll,
    run_async,
    sse_data,
)

C = "/v1/completions"
CHAT = "/v1/chat/completions"
TINY_CONTEXT = 1024
BODY_TIMEOUT_S = 3
MAX_BODY_READS = 4
MAX_BODY_BYTES = 1_000_000
BASE = '{"prompt": [1, 2, 3], "max_tokens": 2, "ignore_eos": true'  # a field is appended


@pytest.fixture(scope="module")
def hostile(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("hostile")
    args = [
        "--model", TINY, "--dtype", "float32", EAGER,
        "--body-timeout", str(BODY_TIMEOUT_S),
        "--max-body-reads", str(MAX_BODY_READS),
        "--max-body-bytes", str(MAX_BODY_BYTES),
    ]  # fmt: skip
    with bench_serve(tmp, *args) as s:
        s.wait_healthy()
        yield s


class LogMark:
    """The server log from a point on: it must hold no traceback and no ERROR line."""

    def __init__(self, server: Server) -> None:
        self.log = server.log
        self.start = server.log.stat().st_size

    def new_text(self) -> str:
        with self.log.open("rb") as f:
            f.seek(self.start)
            return f.read().decode(errors="replace")

    def assert_clean(self) -> None:
        text = self.new_text()
        bad = [line for line in text.splitlines() if "Traceback" in line or " ERROR " in line]
        assert not bad, text[-3000:]


def assert_4xx_or_answer(reply: Reply) -> None:
    """A 4xx with an OpenAI-style body, or a 200 whose choices are whole (not an error)."""
    if 400 <= reply.status < 500:
        assert_openai_error(reply, reply.status, reply.json()["error"]["type"])
        return
    assert reply.status == 200, reply.body[:300]
    if reply.content_type.startswith("text/event-stream"):
        events = [e[len("data: ") :] for e in reply.body.decode().split("\n\n") if e]
        assert events[-1] == "[DONE]", events[-3:]
        for e in events[:-1]:
            assert "error" not in json.loads(e), e
        return
    body = reply.json()
    assert body["choices"], body
    for choice in body["choices"]:
        assert choice["finish_reason"] in ("length", "stop"), choice
    usage = body["usage"]
    assert usage["completion_tokens"] >= len(body["choices"]), usage


# ---- every field x extreme values ---------------------------------------------------------

# JSON text of each value (NaN and Infinity as Python's parser reads them)
HOSTILE_VALUES: dict[str, str] = {
    "2**64": str(2**64),
    "-2**64": str(-(2**64)),
    "2**63": str(2**63),
    "400-digits": "1" + "0" * 400,
    "5000-digits": "9" * 5000,
    "-1": "-1",
    "0": "0",
    "1e308": "1e308",
    "-1e308": "-1e308",
    "1e-320": "1e-320",
    "nan": "NaN",
    "inf": "Infinity",
    "-inf": "-Infinity",
    "string": '"1"',
    "huge-string": json.dumps("x" * 200_000),
    "empty-list": "[]",
    "huge-list": "[" + ",".join(["7"] * 100_000) + "]",
    "object": '{"a": [1, {"b": null}]}',
    "deep": "[" * 50_000 + "]" * 50_000,
    "true": "true",
    "null": "null",
}
FIELDS = [
    "prompt", "max_tokens", "temperature", "top_p", "top_k", "n", "seed", "priority", "stop",
    "stop_token_ids", "stream", "stream_options", "ignore_eos", "include_stop_str_in_output",
    "model", "logprobs", "echo", "best_of", "min_tokens", "min_p", "presence_penalty",
    "frequency_penalty", "repetition_penalty", "logit_bias", "user", "suffix",
]  # fmt: skip


@pytest.mark.parametrize("value", list(HOSTILE_VALUES.values()), ids=list(HOSTILE_VALUES))
@pytest.mark.parametrize("field", FIELDS)
def test_every_field_with_an_extreme_value_gets_a_4xx_or_an_answer(
    hostile: Server, field: str, value: str
) -> None:
    # JSON's last duplicate key wins, so the hostile value replaces the base's
    reply = http_request(hostile, "POST", C, f'{BASE}, "{field}": {value}}}')
    assert_4xx_or_answer(reply)


@pytest.mark.parametrize("value", list(HOSTILE_VALUES.values()), ids=list(HOSTILE_VALUES))
@pytest.mark.parametrize("field", ["messages", "max_completion_tokens"])
def test_chat_fields_with_an_extreme_value_get_a_4xx(
    hostile: Server, field: str, value: str
) -> None:
    messages = '[{"role": "user", "content": "Hi"}]'
    reply = http_request(hostile, "POST", CHAT, f'{{"messages": {messages}, "{field}": {value}}}')
    assert_4xx_or_answer(reply)


def test_after_the_table_the_server_answers_and_holds_nothing(hostile: Server) -> None:
    assert http_request(hostile, "GET", "/health").status == 200
    assert poll(lambda: engine_is_idle(hostile)), metrics(hostile)
    assert_4xx_or_answer(http_request(hostile, "POST", C, BASE + "}"))


# ---- values that passed validation and broke later ----------------------------------------


@pytest.mark.parametrize(
    "seed", [2**64 - 1, 2**63 - 1, -(2**63)], ids=["2**64-1", "2**63-1", "-2**63"]
)
def test_a_seed_at_the_ends_of_64_bits_with_n_gives_every_choice(
    hostile: Server, seed: int
) -> None:
    """Child i of n draws with seed + i: wrapped to 64 bits, not overflowing torch's seed."""
    body = {"prompt": [1, 2, 3], "max_tokens": 3, "ignore_eos": True, "seed": seed, "n": 3}
    replies = [http_request(hostile, "POST", C, body) for _ in range(2)]
    for reply in replies:
        assert reply.status == 200, reply.body[:300]
        assert reply.json()["usage"]["completion_tokens"] == 9
    assert len(replies[0].json()["choices"]) == 3


def test_child_seeds_wrap_to_the_same_stream_as_the_unwrapped_value() -> None:
    """torch seeds with the value mod 2**64: -1 and 2**64 - 1 are one stream."""
    a = torch.Generator().manual_seed(-1)
    b = torch.Generator().manual_seed(2**64 - 1)
    assert torch.equal(torch.rand(4, generator=a), torch.rand(4, generator=b))


@pytest.mark.parametrize("top_p", [1e-46, 5e-324, 1e-30, 1e-7])
def test_a_top_p_too_small_for_float32_samples_the_top_token(top_p: float) -> None:
    """float32(1e-46) is 0: every token was dropped, softmax gave NaN and argmax token 0."""
    logits = torch.randn(3, 50, generator=torch.Generator().manual_seed(0))
    probs = probabilities(logits, [SamplingParams(temperature=1.0, top_p=top_p)] * 3)
    assert not probs.isnan().any()
    assert torch.equal(probs.argmax(-1), logits.argmax(-1))
    assert torch.equal(probs.max(-1).values, torch.ones(3))


def test_a_top_p_too_small_for_float32_is_served(hostile: Server) -> None:
    body = {"prompt": [1, 2, 3], "max_tokens": 2, "ignore_eos": True, "top_p": 1e-46}
    reply = http_request(hostile, "POST", C, body)
    assert reply.status == 200, reply.body[:300]


# ---- compressed bodies --------------------------------------------------------------------

GOOD = json.dumps({"prompt": [1, 2, 3], "max_tokens": 2}).encode()
COMPRESSED = {
    "gzip-garbage": ("gzip", b"not gzip at all"),
    "deflate-garbage": ("deflate", b"not deflate at all"),
    "gzip-truncated": ("gzip", gzip.compress(GOOD)[:15]),
    "gzip-of-not-json": ("gzip", gzip.compress(b"\xff\xfe not json")),
}


@pytest.mark.parametrize(("encoding", "body"), list(COMPRESSED.values()), ids=list(COMPRESSED))
def test_an_undecodable_compressed_body_gets_400(
    hostile: Server, encoding: str, body: bytes
) -> None:
    mark = LogMark(hostile)
    reply = http_request(hostile, "POST", C, body, headers={"Content-Encoding": encoding})
    assert 400 <= reply.status < 500
    assert_openai_error(reply, reply.status, "invalid_request_error")
    mark.assert_clean()


def test_a_body_in_an_unknown_coding_gets_415(hostile: Server) -> None:
    reply = http_request(hostile, "POST", C, GOOD, headers={"Content-Encoding": "x-unknown"})
    assert_openai_error(reply, 415, "invalid_request_error")


def test_brotli_without_its_decoder_gets_400_from_the_http_parser(hostile: Server) -> None:
    """aiohttp refuses it while parsing headers, before any middleware: its own plain-text
    400 names the encoding (no OpenAI-style body is possible there)."""
    mark = LogMark(hostile)
    reply = http_request(hostile, "POST", C, b"\x00\x01", headers={"Content-Encoding": "br"})
    assert reply.status == 400 and b"br" in reply.body, reply.body[:300]
    mark.assert_clean()


@pytest.mark.parametrize(
    ("encoding", "compress"), [("gzip", gzip.compress), ("deflate", zlib.compress)]
)
def test_a_compressed_body_is_served(hostile: Server, encoding: str, compress: Any) -> None:
    reply = http_request(hostile, "POST", C, compress(GOOD), headers={"Content-Encoding": encoding})
    assert reply.status == 200, reply.body[:300]


def test_a_compressed_body_over_the_limit_once_inflated_gets_413(hostile: Server) -> None:
    bomb = gzip.compress(b'{"prompt": "' + b" " * (MAX_BODY_BYTES * 2) + b'"}')
    assert len(bomb) < MAX_BODY_BYTES // 100
    reply = http_request(hostile, "POST", C, bomb, headers={"Content-Encoding": "gzip"})
    assert_openai_error(reply, 413, "invalid_request_error")


# ---- large, slow and unfinished bodies ----------------------------------------------------


def raw_post(server: Server, head: bytes, body: bytes = b"") -> socket.socket:
    s = socket.create_connection(("127.0.0.1", server.port), timeout=BODY_TIMEOUT_S * 5)
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n")
    s.sendall(head + b"\r\n" + body)
    return s


def read_until_closed(s: socket.socket) -> bytes:
    """All the server sends until it closes the connection (a socket timeout fails)."""
    data = b""
    while chunk := s.recv(65536):
        data += chunk
    s.close()
    return data


def parse_raw(data: bytes) -> Reply:
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines[1:])
    return Reply(int(lines[0].split()[1]), headers.get("Content-Type", ""), body)


def test_a_body_larger_than_the_limit_gets_413_before_it_is_sent(hostile: Server) -> None:
    s = raw_post(hostile, b"Content-Length: 15000000\r\n", b"{")
    assert_openai_error(parse_raw(read_until_closed(s)), 413, "invalid_request_error")


def test_a_half_sent_body_gets_408_and_its_connection_closes(hostile: Server) -> None:
    s = raw_post(hostile, b"Content-Length: 500000\r\n", b'{"prompt": ')
    assert_openai_error(parse_raw(read_until_closed(s)), 408, "invalid_request_error")


def test_a_chunked_body_that_never_ends_gets_408(hostile: Server) -> None:
    s = raw_post(hostile, b"Transfer-Encoding: chunked\r\n", b'5\r\n{"pro\r\n')
    assert_openai_error(parse_raw(read_until_closed(s)), 408, "invalid_request_error")


def test_slow_uploads_are_bounded_while_health_and_whole_requests_are_served(
    hostile: Server,
) -> None:
    """Uploads past --max-body-reads get 503 at once, the others 408 after the timeout; a
    request whose body is all there, and /health, are served meanwhile. No descriptor is
    left behind."""
    fds_before = metrics(hostile)["process_open_fds"]
    slow = [
        raw_post(hostile, b"Content-Length: 500000\r\n", b"{") for _ in range(3 * MAX_BODY_READS)
    ]
    time.sleep(0.5)  # let the server start reading them all
    assert http_request(hostile, "GET", "/health", timeout=BODY_TIMEOUT_S).status == 200
    whole = http_request(hostile, "POST", C, {"prompt": [1, 2], "max_tokens": 2})
    assert whole.status == 200, whole.body[:300]
    statuses = sorted(parse_raw(read_until_closed(s)).status for s in slow)
    assert statuses == [408] * MAX_BODY_READS + [503] * (2 * MAX_BODY_READS)
    assert poll(lambda: metrics(hostile)["process_open_fds"] <= fds_before + 1), metrics(hostile)


def test_slow_and_refused_bodies_leave_no_traceback(hostile: Server) -> None:
    mark = LogMark(hostile)
    test_a_half_sent_body_gets_408_and_its_connection_closes(hostile)
    test_a_body_larger_than_the_limit_gets_413_before_it_is_sent(hostile)
    mark.assert_clean()


@pytest.mark.parametrize(
    "raw",
    [
        b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + b"\x00" * 64,  # TLS to a plain port
        b"GET /health HTTP/1.1\r\nX-Big: " + b"a" * 20_000 + b"\r\n\r\n",
        b"POST /v1/completions HTTP/1.1\r\nContent-Length: -5\r\n\r\n",
        b"POST /v1/completions HTTP/1.1\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}",
    ],
    ids=["tls-hello", "header-over-8k", "negative-length", "two-lengths"],
)
def test_broken_http_gets_a_4xx_or_a_close_and_no_traceback(hostile: Server, raw: bytes) -> None:
    """The HTTP parser's refusals: aiohttp's own plain 4xx (no route ran), one log line."""
    mark = LogMark(hostile)
    s = socket.create_connection(("127.0.0.1", hostile.port), timeout=BODY_TIMEOUT_S * 5)
    s.sendall(raw)
    data = read_until_closed(s)
    assert not data or 400 <= parse_raw(data).status < 500, data[:200]
    assert http_request(hostile, "GET", "/health").status == 200
    mark.assert_clean()


# ---- clients that leave -------------------------------------------------------------------

LONG = {"prompt": [1, 2, 3], "max_tokens": TINY_CONTEXT - 24, "ignore_eos": True, "n": 4}


def half_close(server: Server, body: dict[str, Any]) -> None:
    """Send a whole request, then shut the sending side (SHUT_WR), as some clients do."""
    data = json.dumps(body).encode()
    s = raw_post(server, b"Content-Length: %d\r\n" % len(data), data)
    s.shutdown(socket.SHUT_WR)
    read_until_closed(s)


def test_aborted_and_half_closed_n_streams_free_every_kv_block(hostile: Server) -> None:
    """Streams cut after two events, streams and whole requests of half-closing clients,
    whole requests whose clients leave: every one is aborted (far fewer tokens generated
    than asked for), the KV blocks in use go back to zero, and the log holds no error."""
    mark = LogMark(hostile)
    tokens_before = metrics(hostile)["servebench:generation_tokens_total"]

    async def cut_stream(session: aiohttp.ClientSession) -> None:
        resp = await session.post(f"{hostile.url}{C}", json={**LONG, "stream": True})
        assert resp.status == 200
        received = 0
        async for _ in sse_data(resp):
            received += 1
            if received == 2:
                break
        resp.close()

    async def leave_whole(session: aiohttp.ClientSession) -> None:
        with pytest.raises(asyncio.TimeoutError):
            await session.post(f"{hostile.url}{C}", json=LONG, timeout=aiohttp.ClientTimeout(0.3))

    async def main() -> None:
        async with aiohttp.ClientSession() as session:
            await asyncio.gather(
                *(cut_stream(session) for _ in range(12)),
                *(leave_whole(session) for _ in range(4)),
                *(
                    asyncio.to_thread(half_close, hostile, {**LONG, "stream": s})
                    for s in [1, 0] * 2
                ),
            )

    run_async(main())
    assert poll(lambda: engine_is_idle(hostile)), metrics(hostile)
    generated = metrics(hostile)["servebench:generation_tokens_total"] - tokens_before
    asked = 20 * LONG["n"] * LONG["max_tokens"]
    assert generated < asked / 10, (generated, asked)
    mark.assert_clean()
    assert "client" in mark.new_text()  # each abort is one INFO line


# ---- the API key --------------------------------------------------------------------------


def test_the_key_is_compared_by_digest_in_constant_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """Equal-length digests go to hmac.compare_digest, whatever prefix a guess gets right."""
    calls: list[tuple[int, int]] = []
    real = guard.hmac.compare_digest

    def spy(a: bytes, b: bytes) -> bool:
        calls.append((len(a), len(b)))
        return real(a, b)

    monkeypatch.setattr(guard.hmac, "compare_digest", spy)
    digest = guard.make_guard("secret-key", ServerLimits()).api_key_digest
    assert digest is not None
    assert guard.key_matches("Bearer secret-key", digest)
    assert guard.key_matches("bearer secret-key", digest)
    for wrong in ["Bearer secret-kez", "Bearer s", "Bearer ", "", "secret-key", "Basic secret-key"]:
        assert not guard.key_matches(wrong, digest), wrong
    assert calls == [(32, 32)] * len(calls) and len(calls) == 8


def test_an_empty_key_is_refused_by_the_app() -> None:
    with pytest.raises(ValueError, match="empty"):
        guard.make_guard("", ServerLimits())


@pytest.mark.parametrize("how", ["flag", "env"])
def test_bench_serve_refuses_an_empty_key_before_loading(tmp_path: Path, how: str) -> None:
    cmd = [bench_executable(), "serve", "--model", TINY, "--port", str(free_port())]
    env = {**os.environ, API_KEY_ENV: ""} if how == "env" else None
    if how == "flag":
        cmd += ["--api-key", ""]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=env)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "API key is empty" in proc.stdout + proc.stderr
