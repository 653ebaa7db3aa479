"""An OpenAI-compatible server of known timing, to check what the load generator measures.

Every streamed request gets `max_tokens / tokens_per_chunk` chunks: the first `ttft` seconds
after the request arrived, then one every `itl` seconds, each sent at an absolute time (no
drift); with `n` > 1 each of those writes carries one chunk of every choice. With
ttft = itl = 0 the whole stream goes out in one write: a server that costs as
little as possible, for measuring the client's own capacity.

    python -m loadgen.mock_server --port 8100 --ttft 0.2 --itl 0.02
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass

from aiohttp import web

from loadgen.runner import sleep_until


@dataclass(frozen=True, slots=True)
class MockTiming:
    ttft_s: float = 0.1
    itl_s: float = 0.01
    tokens_per_chunk: int = 1
    usage: bool = True  # send the final usage chunk when asked for it


TIMING_KEY = web.AppKey("timing", MockTiming)
COUNT_KEY = web.AppKey("count", list)


def _chunk(chat: bool, text: str, finish: str | None = None, index: int = 0) -> bytes:
    if chat:
        choice = {"index": index, "delta": {"content": text}, "finish_reason": finish}
    else:
        choice = {"index": index, "text": text, "finish_reason": finish}
    body = {"id": "mock", "object": "chunk", "model": "mock", "choices": [choice]}
    return b"data: " + json.dumps(body).encode() + b"\n\n"


def _usage(prompt_tokens: int, completion_tokens: int) -> bytes:
    usage = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }
    body = {"id": "mock", "object": "chunk", "model": "mock", "choices": [], "usage": usage}
    return b"data: " + json.dumps(body).encode() + b"\n\n"


async def _generate(request: web.Request, chat: bool) -> web.StreamResponse:
    arrived = time.perf_counter()
    timing = request.app[TIMING_KEY]
    body = await request.json()
    request.app[COUNT_KEY][0] += 1
    max_tokens = int(body.get("max_tokens") or body.get("max_completion_tokens") or 16)
    # the whole conversation, as a server's usage counts it
    prompt = " ".join(str(m["content"]) for m in body["messages"]) if chat else str(body["prompt"])
    prompt_tokens = len(prompt.split())  # one "token" per word: the load generator's prompts
    per_chunk = timing.tokens_per_chunk
    n_chunks = max(1, -(-max_tokens // per_chunk))
    n = int(body.get("n") or 1)  # parallel sampling: n choices, their chunks side by side
    piece = " tok" * per_chunk
    completion_tokens = n * n_chunks * per_chunk  # usage sums the choices, as vLLM's does
    if not body.get("stream"):
        text = piece * n_chunks
        choices = []
        for i in range(n):
            choice = {"index": i, "finish_reason": "length"}
            message = {"message": {"role": "assistant", "content": text}}
            choices.append(choice | (message if chat else {"text": text}))
        usage = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens}
        return web.json_response({"id": "mock", "choices": choices, "usage": usage})
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    chunks = [
        b"".join(_chunk(chat, piece, "length" if k == n_chunks - 1 else None, i) for i in range(n))
        for k in range(n_chunks)
    ]
    tail = b""
    if timing.usage and (body.get("stream_options") or {}).get("include_usage"):
        tail = _usage(prompt_tokens, completion_tokens)
    tail += b"data: [DONE]\n\n"
    if timing.ttft_s == 0 and timing.itl_s == 0:
        await resp.write(b"".join(chunks) + tail)
        return resp
    for k, chunk in enumerate(chunks):
        await sleep_until(arrived + timing.ttft_s + k * timing.itl_s)
        await resp.write(chunk)
    await resp.write(tail)
    return resp


async def completions(request: web.Request) -> web.StreamResponse:
    return await _generate(request, chat=False)


async def chat_completions(request: web.Request) -> web.StreamResponse:
    return await _generate(request, chat=True)


async def models(request: web.Request) -> web.Response:
    return web.json_response({"object": "list", "data": [{"id": "mock", "object": "model"}]})


async def health(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok", "requests": request.app[COUNT_KEY][0]})


def build_mock_app(timing: MockTiming) -> web.Application:
    app = web.Application()
    app[TIMING_KEY] = timing
    app[COUNT_KEY] = [0]
    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_get("/health", health)
    app.router.add_get("/v1/models", models)
    return app


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8100)
    p.add_argument("--ttft", type=float, default=0.1, help="seconds to the first chunk")
    p.add_argument("--itl", type=float, default=0.01, help="seconds between chunks")
    p.add_argument("--tokens-per-chunk", type=int, default=1)
    p.add_argument("--no-usage", action="store_true", help="never send a usage chunk")
    a = p.parse_args()
    timing = MockTiming(a.ttft, a.itl, a.tokens_per_chunk, not a.no_usage)
    app = build_mock_app(timing)
    try:
        import uvloop  # the server must never be what limits a capacity measurement

        loop = uvloop.new_event_loop()
    except ImportError:
        loop = None
    web.run_app(app, host=a.host, port=a.port, print=None, access_log=None, loop=loop)


if __name__ == "__main__":
    main()
