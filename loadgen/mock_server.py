"""An OpenAI-compatible server of known timing, to check what the load generator measures.

Every streamed request gets `max_tokens / tokens_per_chunk` chunks: the first `ttft` seconds
after the request arrived, then one every `itl` seconds, each sent at an absolute time (no
drift); with `n` > 1 each of those writes carries one chunk of every choice. With
ttft = itl = 0 the whole stream goes out in one write: a server that costs as
little as possible, for measuring the client's own capacity.

    python -m loadgen.mock_server --port 8100 --ttft 0.2 --itl 0.02

It can also misbehave, as servers under stress or behind broken proxies do (MISBEHAVIOURS):
every request with `--misbehave MODE`, or those whose model is MODE (`--model cut`), or every
K-th request of that model from the second on (`--model cut@2`: the test request passes;
`cut@2+a` and `cut@2+b` count apart).

It can also speak another server's dialect (`--dialect`, DIALECTS): that server's /v1/models
`owned_by` and model-id form, its version endpoint and its /metrics names, with the gauges
(running, waiting, KV usage) following the requests it is streaming.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass

from aiohttp import web

from loadgen.event_loop import sleep_until


@dataclass(frozen=True, slots=True)
class MockTiming:
    ttft_s: float = 0.1
    itl_s: float = 0.01
    tokens_per_chunk: int = 1
    usage: bool = True  # send the final usage chunk when asked for it
    template_tokens: int = 0  # what a chat template adds to a chat prompt's count


TIMING_KEY = web.AppKey("timing", MockTiming)
COUNT_KEY = web.AppKey("count", list)
MODE_KEY = web.AppKey("mode", dict)  # misbehave: the default mode, required headers, counts
DIALECT_KEY = web.AppKey("dialect", str)
RUNNING_KEY = web.AppKey("running", list)  # requests being answered now, and the most at once

# What each peer says about itself (looked up in their sources): its model id form, owned_by,
# version endpoint, and /metrics names for running, waiting, KV usage (0-1) and preemptions.
MOCK_MODEL_PATH = "models/SmolLM2-135M-Instruct.Q4_1.gguf"  # relative, as llama-server's -m
DIALECTS: dict[str, dict] = {
    "servebench": {  # root: what a run's prompts are (one word, one token, as counted here)
        "id": "mock",
        "root": "smollm2-135m",
        "metrics": (
            "servebench:num_requests_running",
            "servebench:num_requests_waiting",
            None,
            "servebench:num_preemptions_total",
        ),
        "version": ("/version", {"version": "0.0.0-mock"}),
    },
    "vllm": {
        "id": "mock",
        "root": "smollm2-135m",
        "metrics": (
            "vllm:num_requests_running",
            "vllm:num_requests_waiting",
            "vllm:kv_cache_usage_perc",
            "vllm:num_preemptions_total",
        ),
        "version": ("/version", {"version": "0.11.0"}),
    },
    "sglang": {
        "id": "mock",
        "root": "smollm2-135m",
        "metrics": (
            "sglang:num_running_reqs",
            "sglang:num_queue_reqs",
            "sglang:token_usage",
            "sglang:num_retracted_requests_total",
        ),
        "version": ("/get_server_info", {"version": "0.5.3", "tp_size": 1}),
    },
    "llamacpp": {  # llama-server: the id is the -m path as given, no root
        "id": MOCK_MODEL_PATH,
        "metrics": (
            "llamacpp:requests_processing",
            "llamacpp:requests_deferred",
            "llamacpp:kv_cache_usage_ratio",
            None,
        ),
        "version": (
            "/props",
            {"model_path": MOCK_MODEL_PATH, "build_info": "b6700-mock", "chat_template": ""},
        ),
    },
}

MISBEHAVIOURS = {
    "cut": "the stream stops after choice 0's finish chunk: no usage, no [DONE], and with n > 1 "
    "the other choices without their last chunk",
    "non-object": "a `data: 1` event before the first chunk",
    "json-error": "HTTP 200 with a JSON error body instead of a stream",
    "escape-error": "HTTP 400 whose error message holds terminal escape sequences",
}
ESCAPE_ERROR = "\x1b]0;pwned\x07\x1b[2J\x1b[1;31mthe server says no\x1b[0m\r\x08"
JSON_ERROR = "the model is overloaded (mock)"


def _misbehaviour(app: web.Application, model: str) -> str | None:
    """The mode this request gets: the server's, or its model's (`MODE` or `MODE@K`)."""
    mode, _, every = model.partition("@")
    every = every.partition("+")[0]
    if mode not in MISBEHAVIOURS:
        return app[MODE_KEY]["default"]
    counts = app[MODE_KEY]["counts"]
    counts[model] = counts.get(model, 0) + 1
    if every and (counts[model] == 1 or counts[model] % int(every)):
        return None
    return mode


def _error(message: str, status: int, code: int | None = None) -> web.Response:
    error = {"message": message, "type": "BadRequestError", "code": code or status}
    return web.json_response({"error": error}, status=status)


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
    for name, value in request.app[MODE_KEY]["headers"].items():
        if request.headers.get(name) != value:
            return _error(f"header {name} missing or wrong", 401)
    mode = _misbehaviour(request.app, str(body.get("model") or ""))
    if mode == "escape-error":
        return _error(ESCAPE_ERROR, 400)
    if mode == "json-error":
        return _error(JSON_ERROR, 200, 503)
    max_tokens = int(body.get("max_tokens") or body.get("max_completion_tokens") or 16)
    # the whole conversation, as a server's usage counts it
    prompt = " ".join(str(m["content"]) for m in body["messages"]) if chat else str(body["prompt"])
    prompt_tokens = len(prompt.split())  # one "token" per word: the load generator's prompts
    prompt_tokens += timing.template_tokens if chat else 0
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
    last = n_chunks - 1
    chunks = [
        b"".join(
            _chunk(chat, piece, "length" if k == last else None, i)
            for i in range(n)
            if mode != "cut" or i == 0 or k < last  # cut: only choice 0 finishes
        )
        for k in range(n_chunks)
    ]
    if mode == "non-object":
        chunks[0] = b"data: 1\n\n" + chunks[0]
    tail = b""
    if timing.usage and (body.get("stream_options") or {}).get("include_usage"):
        tail = _usage(prompt_tokens, completion_tokens)
    tail += b"data: [DONE]\n\n"
    if mode == "cut":
        tail = b""
    if timing.ttft_s == 0 and timing.itl_s == 0:
        await resp.write(b"".join(chunks) + tail)
        return resp
    for k, chunk in enumerate(chunks):
        await sleep_until(arrived + timing.ttft_s + k * timing.itl_s)
        await resp.write(chunk)
    await resp.write(tail)
    return resp


async def _counted(request: web.Request, chat: bool) -> web.StreamResponse:
    running = request.app[RUNNING_KEY]
    running[0] += 1
    running[1] = max(running[1], running[0])  # /health's running_peak: a cap's test
    try:
        return await _generate(request, chat)
    finally:
        running[0] -= 1


async def completions(request: web.Request) -> web.StreamResponse:
    return await _counted(request, chat=False)


async def chat_completions(request: web.Request) -> web.StreamResponse:
    return await _counted(request, chat=True)


async def models(request: web.Request) -> web.Response:
    dialect = request.app[DIALECT_KEY]
    spec = DIALECTS[dialect]
    entry = {"id": spec["id"], "object": "model", "owned_by": dialect}
    if "root" in spec:
        entry["root"] = spec["root"]
    return web.json_response({"object": "list", "data": [entry]})


async def metrics(request: web.Request) -> web.Response:
    """The dialect's gauges; vLLM and SGLang label theirs by model, as they do."""
    spec = DIALECTS[request.app[DIALECT_KEY]]
    running = request.app[RUNNING_KEY][0]
    label = '{model_name="mock"}' if request.app[DIALECT_KEY] in ("vllm", "sglang") else ""
    values = (running, 0, min(1.0, running / 64), 0)
    lines = []
    for name, value in zip(spec["metrics"], values, strict=True):
        if name is not None:
            lines += [f"# TYPE {name} gauge", f"{name}{label} {float(value)}"]
    return web.Response(text="\n".join(lines) + "\n", content_type="text/plain")


async def version(request: web.Request) -> web.Response:
    return web.json_response(DIALECTS[request.app[DIALECT_KEY]]["version"][1])


async def health(request: web.Request) -> web.Response:
    count, peak = request.app[COUNT_KEY][0], request.app[RUNNING_KEY][1]
    return web.json_response({"status": "ok", "requests": count, "running_peak": peak})


def build_mock_app(
    timing: MockTiming,
    misbehave: str | None = None,
    headers: dict[str, str] | None = None,
    dialect: str = "servebench",
) -> web.Application:
    """`misbehave`: every request's mode (MISBEHAVIOURS); `headers`: what every request must
    carry (else a 401); `dialect`: whose server it poses as (DIALECTS)."""
    app = web.Application()
    app[DIALECT_KEY] = dialect
    app[RUNNING_KEY] = [0, 0]
    app[TIMING_KEY] = timing
    app[COUNT_KEY] = [0]
    app[MODE_KEY] = {"default": misbehave, "headers": headers or {}, "counts": {}}
    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_get("/health", health)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/metrics", metrics)
    app.router.add_get(DIALECTS[dialect]["version"][0], version)
    return app


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8100)
    p.add_argument("--ttft", type=float, default=0.1, help="seconds to the first chunk")
    p.add_argument("--itl", type=float, default=0.01, help="seconds between chunks")
    p.add_argument("--tokens-per-chunk", type=int, default=1)
    p.add_argument("--no-usage", action="store_true", help="never send a usage chunk")
    p.add_argument("--template-tokens", type=int, default=0, help="a chat template's tokens")
    p.add_argument("--misbehave", choices=sorted(MISBEHAVIOURS), help="every request's mode")
    p.add_argument("--require-header", action="append", default=[], help="'NAME: VALUE' (else 401)")
    p.add_argument("--dialect", choices=sorted(DIALECTS), default="servebench", help="pose as")
    p.add_argument("--tag", default="", help="ignored: a sweep axis for --serve-cmd tests")
    a = p.parse_args()
    timing = MockTiming(a.ttft, a.itl, a.tokens_per_chunk, not a.no_usage, a.template_tokens)
    required = dict(h.split(": ", 1) for h in a.require_header)
    app = build_mock_app(timing, a.misbehave, required, a.dialect)
    try:
        import uvloop  # the server must never be what limits a capacity measurement

        loop = uvloop.new_event_loop()
    except ImportError:
        loop = None
    web.run_app(app, host=a.host, port=a.port, print=None, access_log=None, loop=loop)


if __name__ == "__main__":
    main()
