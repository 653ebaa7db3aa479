"""Turning engine outputs into OpenAI responses: one JSON body, or server-sent events that
interleave a request's choices as they come."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

from aiohttp import web

from engine.core.request import RequestOutput
from engine.serving.async_engine import EngineStepError, RequestStream
from engine.serving.metrics import Histogram
from engine.serving.protocol import APIError

log = logging.getLogger(__name__)


async def merged(
    streams: list[RequestStream], n: int = 1
) -> AsyncIterator[tuple[int, RequestOutput]]:
    """Interleave several requests' outputs as they come, each with its choice index (prompt
    i's completion j is choice i * n + j, as vLLM numbers them); closing this closes them
    all."""
    queue: asyncio.Queue[tuple[int, RequestOutput | BaseException | None]] = asyncio.Queue()

    async def pump(i: int, s: AsyncIterator[RequestOutput]) -> None:
        try:
            async for out in s:
                await queue.put((i, out))
            await queue.put((i, None))
        except Exception as e:  # re-raised on the consumer side
            await queue.put((i, e))

    tasks = [asyncio.create_task(pump(i, s)) for i, s in enumerate(streams)]
    try:
        open_ = len(tasks)
        while open_:
            i, item = await queue.get()
            if item is None:
                open_ -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield i * n + item.outputs[0].index, item
    finally:
        for t in tasks:
            t.cancel()
        for s in streams:
            await s.aclose()


def usage(outputs: dict[int, RequestOutput]) -> dict[str, Any]:
    """OpenAI's usage by choice: each prompt counted once (its n completions share it), with
    the prompt tokens the prefix cache served (prompt_tokens_details.cached_tokens, as vLLM
    and OpenAI report them)."""
    prompts = [o for o in outputs.values() if o.outputs[0].index == 0]  # the first completion
    p = sum(len(o.prompt_token_ids) for o in prompts)
    c = sum(len(o.outputs[0].token_ids) for o in outputs.values())
    cached = sum(o.num_cached_tokens for o in prompts)
    return {
        "prompt_tokens": p,
        "completion_tokens": c,
        "total_tokens": p + c,
        "prompt_tokens_details": {"cached_tokens": cached},
    }


async def full_response(
    streams: list[RequestStream], chat: bool, meta: dict[str, Any], n: int = 1
) -> web.Response:
    last: dict[int, RequestOutput] = {}
    try:
        async with contextlib.aclosing(merged(streams, n)) as outs:
            async for i, out in outs:
                last[i] = out
    except EngineStepError as e:
        raise APIError(str(e), 500, type_="server_error") from e
    choices = []
    for i in sorted(last):
        c = last[i].outputs[0]
        choice: dict[str, Any] = {
            "index": i,
            "finish_reason": c.finish_reason,
            "stop_reason": c.stop_reason,
            "logprobs": None,
        }
        if chat:
            choice["message"] = {"role": "assistant", "content": c.text}
        else:
            choice["text"] = c.text
        choices.append(choice)
    obj = "chat.completion" if chat else "text_completion"
    return web.json_response({**meta, "object": obj, "choices": choices, "usage": usage(last)})


async def stream_response(
    request: web.Request,
    streams: list[RequestStream],
    include_usage: bool,
    chat: bool,
    meta: dict[str, Any],
    ttft_s: Histogram,
    n: int = 1,
) -> web.StreamResponse:
    resp = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
    )
    await resp.prepare(request)
    obj = "chat.completion.chunk" if chat else "text_completion"
    sent_len: dict[int, int] = {}
    last: dict[int, RequestOutput] = {}

    async def send(payload: dict[str, Any] | str) -> None:
        data = payload if isinstance(payload, str) else json.dumps(payload)
        await resp.write(f"data: {data}\n\n".encode())

    def chunk(i: int, text: str, finish: str | None, first: bool) -> dict[str, Any]:
        if chat:
            delta: dict[str, Any] = {"content": text}
            if first:
                delta["role"] = "assistant"
            choice: dict[str, Any] = {
                "index": i,
                "delta": delta,
                "logprobs": None,
                "finish_reason": finish,
            }
        else:
            choice = {"index": i, "text": text, "logprobs": None, "finish_reason": finish}
        return {**meta, "object": obj, "choices": [choice]}

    try:
        async with contextlib.aclosing(merged(streams, n)) as outs:
            async for i, out in outs:
                if request.transport is None or request.transport.is_closing():
                    raise ConnectionResetError  # gone, even if no text was due to it
                first = i not in last
                c = out.outputs[0]
                if first and c.index == 0 and out.metrics.first_token_time is not None:
                    ttft_s.observe(out.metrics.first_token_time - out.metrics.arrival_time)
                last[i] = out
                text = c.text[sent_len.get(i, 0) :]
                sent_len[i] = len(c.text)
                done = c.finish_reason is not None  # this completion (n > 1: not its siblings)
                if text or done or first:
                    await send(chunk(i, text, c.finish_reason, first))
        if include_usage:
            await send({**meta, "object": obj, "choices": [], "usage": usage(last)})
        await send("[DONE]")
    except EngineStepError as e:
        await send(APIError(str(e), 500, type_="server_error").body())
        await send("[DONE]")
    except ConnectionResetError:  # aclosing() above has already aborted the request
        log.info("client of %s went away; its request was aborted", meta["id"])
        return resp
    except Exception as e:  # a bug of ours mid-stream: the status is sent, so say it in-band
        log.exception("stream %s failed", meta["id"])
        with contextlib.suppress(ConnectionResetError):
            err = APIError(f"internal error: {type(e).__name__}", 500, type_="server_error")
            await send(err.body())
            await send("[DONE]")
    await resp.write_eof()
    return resp
