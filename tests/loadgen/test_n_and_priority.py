"""Parallel sampling (`n`) and priority on the wire: the body fields vLLM reads, a stream of n
interleaved choices (tokens counted over all of them, ITL within each), the mock server's n
choices, and the in-process engine given both (or failing the request with its reason)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web

from loadgen.backends import OpenAIBackend
from loadgen.in_process_backend import InProcessBackend
from loadgen.metrics import summarize
from loadgen.records import RequestRecord
from loadgen.workload import RequestSpec

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


async def _send(
    url: str | None, spec: RequestSpec, handler: Handler | None = None
) -> RequestRecord:
    """One request through OpenAIBackend, to `url` or to a one-route server of `handler`."""
    runner = None
    if handler is not None:
        app = web.Application()
        app.router.add_post("/v1/completions", handler)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        url = f"http://127.0.0.1:{port}/v1"
    assert url is not None
    backend = OpenAIBackend(url, "mock", timeout_s=5.0)
    await backend.start()
    r = RequestRecord(0, "r0", spec.input_len, spec.output_len, n=spec.n, cls=spec.cls)
    try:
        await backend.send(spec, r, 0.0)
    finally:
        await backend.close()
        if runner is not None:
            await runner.cleanup()
    return r


def _event(obj: object) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def test_n_and_priority_are_sent_as_vllm_reads_them() -> None:
    seen: list[dict[str, Any]] = []

    async def handler(request: web.Request) -> web.StreamResponse:
        seen.append(await request.json())
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(_event({"choices": [{"index": 0, "text": "x"}]}) + b"data: [DONE]\n\n")
        return resp

    asyncio.run(_send(None, RequestSpec("hi", 1, 2, n=3, priority=0), handler))
    asyncio.run(_send(None, RequestSpec("hi", 1, 2, priority=-2), handler))
    asyncio.run(_send(None, RequestSpec("hi", 1, 2), handler))
    assert (seen[0]["n"], seen[0]["priority"]) == (3, 0)  # priority 0 is sent: it is a value
    assert "n" not in seen[1] and seen[1]["priority"] == -2
    assert "n" not in seen[2] and "priority" not in seen[2]  # the server's defaults


async def _interleaved(request: web.Request) -> web.StreamResponse:
    """Two choices, 50 ms apart, each with a chunk every 100 ms; usage sums them."""
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    for k in range(3):
        for i in (0, 1):
            finish = "length" if k == 2 else None
            await resp.write(
                _event({"choices": [{"index": i, "text": " t", "finish_reason": finish}]})
            )
            await asyncio.sleep(0.05)
    usage = {"prompt_tokens": 1, "completion_tokens": 6}
    await resp.write(_event({"choices": [], "usage": usage}) + b"data: [DONE]\n\n")
    return resp


def test_interleaved_choices_count_every_token_and_time_gaps_within_each_choice() -> None:
    r = asyncio.run(_send(None, RequestSpec("hi", 1, 3, n=2), _interleaved))
    assert r.status == "ok", r.error
    assert r.output_tokens == 6 and r.output_tokens_source == "usage"
    assert r.chunk_choice == [0, 1, 0, 1, 0, 1]
    assert r.first_chunk_s == r.chunk_s[0]  # the first chunk of any choice
    gaps = [g for g, _ in r.gaps()]
    assert len(gaps) == 4 and min(gaps) > 0.08  # 100 ms within a choice, never the 50 ms
    s = summarize([r], 1.0)
    assert s["itl_s"]["count"] == 4 and s["itl_s"]["p50"] > 0.08
    # TPOT per sequence: (E2E - TTFT) over each choice's 3 tokens less one, not over 6 - 1
    assert s["tpot_s"]["mean"] == pytest.approx((r.end_s - r.first_chunk_s) / 2)  # type: ignore[operator]


async def _one_choice_aborts(request: web.Request) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    await resp.write(_event({"choices": [{"index": 0, "text": "a", "finish_reason": "abort"}]}))
    await resp.write(_event({"choices": [{"index": 1, "text": "b", "finish_reason": "length"}]}))
    await resp.write(b"data: [DONE]\n\n")
    return resp


def test_one_aborted_choice_fails_the_request() -> None:
    r = asyncio.run(_send(None, RequestSpec("hi", 1, 1, n=2), _one_choice_aborts))
    assert r.status == "error" and "abort" in (r.error or "")


@pytest.mark.serial  # chunk gaps of 20 ms, seen apart
def test_the_mock_server_streams_n_choices(mock_server: Callable[..., str]) -> None:
    url = mock_server("--ttft", "0.05", "--itl", "0.02")
    r = asyncio.run(_send(url, RequestSpec(" a b c", 3, 5, n=3, priority=1)))
    assert r.status == "ok", r.error
    assert r.output_tokens == 15 and len(r.chunk_s) == 15
    assert sorted(r.chunk_choice) == [0] * 5 + [1] * 5 + [2] * 5
    assert r.first_chunk_s is not None and r.send_s is not None
    assert r.first_chunk_s - r.send_s >= 0.05
    gaps = [g for g, _ in r.gaps()]
    assert len(gaps) == 12 and min(gaps) > 0.01  # 20 ms apart within each choice
    plain = asyncio.run(_send(url, RequestSpec(" a b c", 3, 5)))
    assert plain.output_tokens == 5 and plain.chunk_choice == []


# ---- in process ---------------------------------------------------------------------------------


@dataclass
class _Completion:
    text: str
    token_ids: list[int]
    index: int = 0
    finish_reason: str | None = "length"


@dataclass
class _Output:
    new_token_ids: list[int]
    finished: bool
    outputs: list[_Completion] = field(default_factory=list)
    prompt_token_ids: list[int] = field(default_factory=lambda: [1, 2])
    error: str | None = None
    num_cached_tokens: int = 0


class _Engine:
    """An async engine that takes a priority and streams n completions of 2 tokens the way
    ours does: one output per completion per step, told apart by `outputs[0].index`, the last
    one `finished`."""

    tokenizer = None

    def __init__(self) -> None:
        self.engine = self
        self.calls: list[tuple[int, int | None]] = []

    def generate(
        self, request_id: str, prompt: Any, params: Any, priority: int | None = None
    ) -> AsyncIterator[_Output]:
        self.calls.append((params.n, priority))

        async def stream() -> AsyncIterator[_Output]:
            for tokens, reason in (([5], None), ([5, 6], "length")):
                for i in range(params.n):
                    done = reason is not None and i == params.n - 1
                    completion = _Completion("x", tokens, i, reason)
                    yield _Output(tokens[-1:], done, [completion])

        return stream()


class _OldEngine(_Engine):
    def generate(self, request_id: str, prompt: Any, params: Any) -> AsyncIterator[_Output]:  # type: ignore[override]
        return super().generate(request_id, prompt, params)


def _in_process(engine: Any, spec: RequestSpec) -> RequestRecord:
    r = RequestRecord(0, "r0", 2, spec.output_len, n=spec.n)
    asyncio.run(InProcessBackend(engine).send(spec, r, 0.0))
    return r


def test_the_in_process_engine_gets_the_priority_and_n() -> None:
    engine = _Engine()
    r = _in_process(engine, RequestSpec("hi", 2, 2, priority=4))
    assert r.status == "ok" and engine.calls == [(1, 4)]
    r = _in_process(engine, RequestSpec("hi", 2, 2, n=2))
    assert r.status == "ok" and engine.calls[-1] == (2, None) and r.output_tokens == 4
    assert r.chunk_choice == [0, 1, 0, 1]  # each completion's chunks, for its own ITL


def test_an_engine_without_priorities_fails_the_request_with_its_reason() -> None:
    r = _in_process(_OldEngine(), RequestSpec("hi", 2, 2, priority=1))
    assert r.status == "error" and "priority" in (r.error or "")
    r = _in_process(_OldEngine(), RequestSpec("hi", 2, 2))
    assert r.status == "ok", r.error  # no priority asked: none passed
