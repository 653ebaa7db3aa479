"""An instant OpenAI-compatible server on a bare asyncio protocol: the nginx-like stand-in
for measuring load generators, cheaper per request than `loadgen.mock_server --ttft 0
--itl 0` (no aiohttp request objects, each distinct response built once and cached).

It answers what the load generators compared here send: POST /v1/completions and
/v1/chat/completions (streamed or not; the stream in one write, the same chunks and usage
as mock_server's, `max_tokens` chunks of one token), GET /v1/models and /health (with the
count of requests answered). HTTP/1.1 with keep-alive; request bodies need a Content-Length.

    python benchmarks/instant_server.py --port 8199
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from loadgen.mock_server import _chunk, _usage  # one wire format for both servers

MAX_CACHED = 4096


class InstantServer:
    """Counts requests and keeps the bytes of each distinct response."""

    def __init__(self) -> None:
        self.requests = 0
        self.cache: dict[tuple, bytes] = {}

    def respond(self, method: str, path: str, body: bytes) -> bytes:
        if method == "GET" and path == "/health":
            return _response(200, "application/json", {"status": "ok", "requests": self.requests})
        if method == "GET" and path == "/v1/models":
            model = {"id": "mock", "object": "model", "owned_by": "instant", "root": "smollm2-135m"}
            return _response(200, "application/json", {"object": "list", "data": [model]})
        if method != "POST" or path not in ("/v1/completions", "/v1/chat/completions"):
            return _response(404, "application/json", {"error": {"message": "not found"}})
        try:
            req = json.loads(body)
            chat = path.endswith("chat/completions")
            prompt = " ".join(str(m["content"]) for m in req["messages"]) if chat else req["prompt"]
            max_tokens = int(req.get("max_tokens") or req.get("max_completion_tokens") or 16)
        except (ValueError, KeyError, TypeError) as e:
            return _response(400, "application/json", {"error": {"message": str(e)}})
        self.requests += 1
        usage = bool((req.get("stream_options") or {}).get("include_usage"))
        key = (chat, max_tokens, bool(req.get("stream")), usage, len(str(prompt).split()))
        if (cached := self.cache.get(key)) is None:
            if len(self.cache) >= MAX_CACHED:
                self.cache.clear()
            cached = self.cache[key] = _completion(*key)
        return cached


def _completion(chat: bool, max_tokens: int, stream: bool, usage: bool, prompt: int) -> bytes:
    if not stream:
        text = " tok" * max_tokens
        choice = {"index": 0, "finish_reason": "length"}
        choice |= {"message": {"role": "assistant", "content": text}} if chat else {"text": text}
        counts = {"prompt_tokens": prompt, "completion_tokens": max_tokens}
        return _response(
            200, "application/json", {"id": "mock", "choices": [choice], "usage": counts}
        )
    last = max_tokens - 1
    body = b"".join(
        _chunk(chat, " tok", "length" if k == last else None) for k in range(max_tokens)
    )
    body += (_usage(prompt, max_tokens) if usage else b"") + b"data: [DONE]\n\n"
    return _head(200, "text/event-stream", len(body)) + body


def _head(status: int, content_type: str, length: int) -> bytes:
    reason = {200: "OK", 400: "Bad Request", 404: "Not Found"}[status]
    return (
        f"HTTP/1.1 {status} {reason}\r\nContent-Type: {content_type}\r\n"
        f"Content-Length: {length}\r\n\r\n"
    ).encode()


def _response(status: int, content_type: str, obj: object) -> bytes:
    body = json.dumps(obj).encode()
    return _head(status, content_type, len(body)) + body


class Connection(asyncio.Protocol):
    """One keep-alive connection: requests parsed as their bytes arrive, answered in order."""

    def __init__(self, server: InstantServer) -> None:
        self.server = server
        self.buf = b""
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while (end := self.buf.find(b"\r\n\r\n")) >= 0:
            lines = self.buf[:end].decode("latin-1").split("\r\n")
            method, path = lines[0].split(" ", 2)[:2]
            headers = {}
            for line in lines[1:]:
                name, _, value = line.partition(":")
                headers[name.strip().lower()] = value.strip().lower()
            length = int(headers.get("content-length", 0))
            if len(self.buf) < end + 4 + length:
                return  # the body is still arriving
            body = self.buf[end + 4 : end + 4 + length]
            self.buf = self.buf[end + 4 + length :]
            assert self.transport is not None
            self.transport.write(self.server.respond(method, path.split("?")[0], body))
            if headers.get("connection") == "close" or "transfer-encoding" in headers:
                self.transport.close()  # chunked request bodies are not read: hang up
                return


async def serve(host: str, port: int) -> None:
    server = InstantServer()
    loop = asyncio.get_running_loop()
    listener = await loop.create_server(lambda: Connection(server), host, port, backlog=4096)
    async with listener:
        await listener.serve_forever()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8100)
    a = p.parse_args()
    try:
        import uvloop  # the server must never be what limits a measurement of the client

        factory = uvloop.new_event_loop
    except ImportError:
        factory = None
    with asyncio.Runner(loop_factory=factory) as runner:
        runner.run(serve(a.host, a.port))


if __name__ == "__main__":
    main()
