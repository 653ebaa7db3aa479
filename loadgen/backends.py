"""How a request reaches a server and how its timing is taken: the `Backend` interface, and
`OpenAIBackend`, over HTTP from any OpenAI-compatible server (vLLM, SGLang, llama.cpp, TGI,
ours). The in-process, naive and simulated backends are beside it (in_process_backend.py,
naive_backend.py, sim_backend.py).

A backend fills a `RequestRecord`: send time, a stamp for every chunk that carries output,
token counts and status. It never raises for a failed request: the record says what failed."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterable
from typing import Any, Protocol

import aiohttp

from loadgen.endpoints import api_url
from loadgen.records import RequestRecord
from loadgen.redact import redact_url
from loadgen.workload import RequestSpec

try:  # 2x json's speed on a read of 33 chunks, 5x on one (benchmarks/loadgen_client_cost.py)
    from orjson import loads as _fast_loads
except ImportError:  # a dependency, but the client runs without it
    _fast_loads = json.loads


class Backend(Protocol):
    name: str

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    async def send(self, spec: RequestSpec, rec: RequestRecord, t0: float) -> None:
        """Send one request now; times in `rec` are perf_counter() - t0."""
        ...


class OpenAIBackend:
    """Streaming /v1/completions or /v1/chat/completions over one shared aiohttp session."""

    name = "openai"

    def __init__(
        self,
        base_url: str,
        model: str,
        endpoint: str = "completions",
        api_key: str | None = None,
        timeout_s: float = 600.0,
        max_connections: int = 256,
        ignore_eos: bool = True,
        tokenizer: Any | None = None,
        extra_body: dict[str, Any] | None = None,
        sampling: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        if endpoint not in ("completions", "chat"):
            raise ValueError(f"endpoint {endpoint!r}: expected completions or chat")
        path = "chat/completions" if endpoint == "chat" else "completions"
        self.url = api_url(base_url, path)
        self.shown_url = redact_url(self.url)  # what messages and records say: no credentials
        self.model, self.chat = model, endpoint == "chat"
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.headers |= headers or {}
        self.sampling = sampling or {"temperature": 0.0}  # greedy unless asked otherwise
        self.timeout = aiohttp.ClientTimeout(total=timeout_s)
        self.max_connections = max_connections
        self.ignore_eos = ignore_eos
        self.tokenizer = tokenizer  # counts tokens when the server gives no usage
        self.extra_body = extra_body or {}
        self._session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        connector = aiohttp.TCPConnector(limit=self.max_connections, force_close=False)
        self._session = aiohttp.ClientSession(connector=connector, timeout=self.timeout)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    def payload(self, spec: RequestSpec) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.model,
            "max_tokens": spec.output_len,
            **self.sampling,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if self.chat:
            body["messages"] = spec.messages()
        else:
            body["prompt"] = spec.text()
        if self.ignore_eos:
            body["ignore_eos"] = True
        if spec.n > 1:  # vLLM's body fields: n completions, a priority (lower goes first)
            body["n"] = spec.n
        if spec.priority is not None:
            body["priority"] = spec.priority
        return body | self.extra_body

    async def send(self, spec: RequestSpec, rec: RequestRecord, t0: float) -> None:
        assert self._session is not None, "start() the backend first"
        body = json.dumps(self.payload(spec))
        headers = {"Content-Type": "application/json", **self.headers}
        texts: list[str] = []
        usage: dict[str, Any] = {}
        finished: set[int] = set()  # the choices that came with a finish_reason
        clock = time.perf_counter
        rec.send_s = clock() - t0
        try:
            async with self._session.post(self.url, data=body, headers=headers) as resp:
                rec.http_status = resp.status
                if resp.status != 200:
                    rec.status, rec.error = "error", _error_message(await resp.text())
                    if resp.status == 404:  # a wrong path or model: say where it went
                        rec.error += f" (POST {self.shown_url})"
                    return
                if resp.content_type == "application/json":  # an answer, not a stream
                    rec.status, rec.error = "error", _not_a_stream(await resp.text())
                    return
                buf, done = b"", False
                # Read whatever has arrived and split it into events ourselves: one await per
                # network read, not per line. Events that came in one read share its stamp.
                async for data in resp.content.iter_any():
                    buf, done = self._feed(buf + data, clock() - t0, rec, texts, usage, finished)
                    if done:
                        break
                if not done and buf.strip():  # a last event without its closing blank line
                    datas, done = _event_data([buf])
                    if self._take(datas, clock() - t0, rec, texts, usage, finished):
                        done = True
            rec.end_s = clock() - t0
        except asyncio.CancelledError:
            rec.status, rec.error = "cancelled", "the run was stopped"
            rec.end_s = clock() - t0
            self._keep_partial(rec, texts, usage)
            raise
        except (aiohttp.ClientError, TimeoutError, ValueError, KeyError, TypeError) as e:
            error = f"{type(e).__name__}: {e}" if str(e) else repr(e)
            rec.status, rec.error = "error", error.replace(self.url, self.shown_url)
            if isinstance(e, aiohttp.ClientConnectionError | TimeoutError):
                rec.error += f" (POST {self.shown_url})"
            rec.end_s = clock() - t0
            self._keep_partial(rec, texts, usage)
            return
        if rec.status == "error":
            self._keep_partial(rec, texts, usage)
            return
        if not rec.chunk_s:
            rec.status, rec.error = "error", "the stream ended without any output"
            return
        self._keep_partial(rec, texts, usage)
        if rec.finish_reason in ("abort", "error"):  # vLLM's and ours: the server gave up
            rec.status = "error"
            rec.error = f"the server ended the stream with finish_reason {rec.finish_reason!r}"
        elif not done:  # whatever came before: the server may have died mid-answer
            rec.status = "error"
            rec.error = f"the stream was cut after {len(rec.chunk_s)} chunks (no [DONE])"
        elif len(finished) < rec.n:  # a choice without its finish chunk: cut short too
            rec.status = "error"
            rec.error = (
                f"the stream ended with {rec.n - len(finished)} of {rec.n} completions "
                "unfinished (no finish_reason)"
            )
        else:
            rec.status = "ok"

    def _keep_partial(self, rec: RequestRecord, texts: list[str], usage: dict[str, Any]) -> None:
        """What a request got before it ended, finished or not: a failed stream keeps its
        first-chunk time and token counts (they stay out of the latency figures)."""
        if rec.session is not None:  # only a conversation's next turn reads it
            rec.reply = "".join(texts)
        if rec.chunk_s:
            rec.first_chunk_s = rec.chunk_s[0]
            self._count_tokens(rec, texts, usage)

    def _feed(
        self,
        text: bytes,
        now: float,
        rec: RequestRecord,
        texts: list[str],
        usage: dict[str, Any],
        finished: set[int],
    ) -> tuple[bytes, bool]:
        """Record the complete events of what has arrived (stamped `now`); the unfinished
        rest, and whether the stream is over ([DONE] or an error event)."""
        datas, done, rest = _read_events(text)
        return rest, bool(datas and self._take(datas, now, rec, texts, usage, finished)) or done

    def _take(
        self,
        datas: list[bytes],
        now: float,
        rec: RequestRecord,
        texts: list[str],
        usage: dict[str, Any],
        finished: set[int],
    ) -> bool:
        """Record a read's events' data; True if one was an error (the stream is over)."""
        chat, stamps = self.chat, rec.chunk_s  # this loop runs for every chunk of every stream
        for chunk in _chunks(datas):
            if chunk.get("error"):
                rec.status, rec.error = "error", _error_message(json.dumps(chunk))
                return True
            if chunk.get("usage"):
                usage.update(chunk["usage"])
            for choice in chunk.get("choices") or ():
                if type(choice) is not dict:
                    raise ValueError(
                        f"a stream chunk's choice is not a JSON object: {choice!r:.200}"
                    )
                if chat:  # reasoning models stream their thinking first: output too
                    delta = choice.get("delta") or {}
                    text = (delta.get("reasoning_content") or "") + (delta.get("content") or "")
                else:
                    text = choice.get("text")
                if text:
                    stamps.append(now)
                    texts.append(text)
                    if rec.n > 1:  # n choices stream interleaved: ITL is per choice
                        rec.chunk_choice.append(int(choice.get("index") or 0))
                if reason := choice.get("finish_reason"):
                    finished.add(int(choice.get("index") or 0))
                    if rec.finish_reason not in ("abort", "error"):  # one choice's abort fails it
                        rec.finish_reason = reason
        return False

    def _count_tokens(self, rec: RequestRecord, texts: list[str], usage: dict[str, Any]) -> None:
        """Output tokens from the server's usage, else our tokenizer, else one per chunk; and
        tokens per chunk: one each when there are no more tokens than chunks, else our
        tokenizer's split of each chunk's text when it adds up, else the total spread evenly."""
        n_chunks = len(texts)
        if usage.get("completion_tokens") is not None:
            rec.output_tokens, rec.output_tokens_source = int(usage["completion_tokens"]), "usage"
        elif self.tokenizer is not None:
            n = len(self.tokenizer.encode("".join(texts), add_special_tokens=False))
            rec.output_tokens, rec.output_tokens_source = n, "tokenizer"
        else:
            rec.output_tokens, rec.output_tokens_source = n_chunks, "chunks"
        details = usage.get("prompt_tokens_details") or {}  # vLLM, SGLang, OpenAI, ours
        if isinstance(details, dict) and details.get("cached_tokens") is not None:
            rec.cached_tokens = int(details["cached_tokens"])
        if usage.get("prompt_tokens") is not None:
            rec.prompt_tokens, rec.prompt_tokens_source = int(usage["prompt_tokens"]), "usage"
        else:
            rec.prompt_tokens, rec.prompt_tokens_source = rec.input_len, "tokenizer"
        if rec.output_tokens <= n_chunks:  # one each (a chunk carries at least one token)
            rec.chunk_tokens = [1] * n_chunks
            return
        if self.tokenizer is not None:
            enc = self.tokenizer.encode
            split = [max(1, len(enc(t, add_special_tokens=False))) for t in texts]
            if sum(split) == rec.output_tokens:
                rec.chunk_tokens = split
                return
        q, r = divmod(rec.output_tokens, n_chunks)  # spread evenly: the best remaining guess
        rec.chunk_tokens = [q + (k < r) for k in range(n_chunks)]


def _read_events(text: bytes) -> tuple[list[bytes], bool, bytes]:
    """The data of the complete events in `text` up to [DONE], whether [DONE] came, and the
    unfinished rest. Where every event is one `data:` line, as every server here sends them,
    all the payloads come from one split: splitting and reading event by event took 13 of the
    62 us a 33-event read cost to parse (benchmarks/loadgen_client_cost.py)."""
    if b"\r" in text:
        text = text.replace(b"\r\n", b"\n")
    if text.endswith(b"\n\n") and text.find(b"\n") == len(text) - 2 and text[:5] == b"data:":
        data = text[5:-2]  # one event, as a server streaming token by token sends each
        return ([], True, b"") if _is_done(data) else ([data], False, b"")
    end = text.rfind(b"\n\n")
    if end < 0:
        return [], False, text
    rest = text[end + 2 :] if end + 2 < len(text) else b""
    if text[:5] == b"data:":
        datas = text[5:end].split(b"\n\ndata:")  # JSON allows the space left before each
        # Raw newlines come only as separators (JSON escapes its own): this count holds
        # exactly when every event is one `data:` line.
        if text.count(b"\n", 0, end) == 2 * (len(datas) - 1):
            if text.find(b"[DONE]", 0, end - len(datas[-1])) < 0:  # last, as servers put it
                return (datas[:-1], True, rest) if _is_done(datas[-1]) else (datas, False, rest)
            for i, data in enumerate(datas):
                if _is_done(data):
                    return datas[:i], True, rest
            return datas, False, rest
    return (*_event_data(text[:end].split(b"\n\n")), rest)


def _is_done(data: bytes) -> bool:
    """An event's data is the stream's end, `[DONE]` (spaces around it allowed)."""
    return b"[DONE]" in data and data.strip() == b"[DONE]"


def _event_data(events: list[bytes]) -> tuple[list[bytes], bool]:
    """The data of a read's events up to [DONE], and whether [DONE] came."""
    datas = []
    for event in events:
        data = _sse_data(event)
        if data == b"[DONE]":
            return datas, True
        if data is not None:
            datas.append(data)
    return datas, False


def _sse_data(event: bytes) -> bytes | None:
    """The data of one server-sent event (its `data:` lines joined), None if it has none."""
    if b"\n" not in event:  # one line, as nearly every server sends
        return event[5:].strip() if event.startswith(b"data:") else None
    lines = [line[5:].strip() for line in event.split(b"\n") if line.startswith(b"data:")]
    return b"\n".join(lines) if lines else None


def _chunks(datas: list[bytes]) -> Iterable[dict[str, Any]]:
    """The events' JSON objects, a read's events parsed in one call: one call per event was
    most of the client's time at thousands of streams a second (32,000 chunks a second at
    1,000 req/s). Where that does not give one object per event, one by one, so the events
    before a broken one still count and the error names it."""
    if len(datas) > 1:
        try:
            chunks = _fast_loads(b"[" + b",".join(datas) + b"]")
        except ValueError:
            chunks = None
        if type(chunks) is list and len(chunks) == len(datas) and set(map(type, chunks)) == {dict}:
            return chunks
    return map(_chunk, datas)


def _chunk(data: bytes) -> dict[str, Any]:
    try:
        chunk = _fast_loads(data)
    except ValueError:  # what orjson refuses and json reads (NaN, Infinity), or json's error
        chunk = json.loads(data)
    if type(chunk) is not dict:  # `data: 1`: the server's bug, this request's failure
        raise ValueError(f"a stream chunk is not a JSON object: {data.strip()[:200]!r}")
    return chunk


def _not_a_stream(body: str) -> str:
    """A 200 that is JSON, not events: the server's error message when it is one."""
    try:
        value = json.loads(body)
    except ValueError:
        value = None
    if isinstance(value, dict) and "error" in value:
        return _error_message(body)
    return f"the server answered with JSON, not a stream: {body[:500]}"


def _error_message(body: str) -> str:
    """The message of an OpenAI-style error body, else the body itself (shortened)."""
    try:
        err = json.loads(body).get("error")
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])
        if isinstance(err, str):
            return err
    except (ValueError, AttributeError):
        pass
    return body[:500]
