"""`--workers auto`: how many worker processes a schedule needs, from its busiest second and
what one event loop keeps, measured at start, capped by the cores this process may use less
those a bundled server on this machine takes.

The measurement sends real requests through the run's own HTTP client (OpenAIBackend: aiohttp,
SSE parsing, a record each) to a canned server in a thread of this process that answers each
with 32 streamed chunks at once, and counts the CPU seconds of the sending thread alone: the
server's work is not counted, the client's is. One loop keeps to its schedule up to about half
of the rate at which it would be busy all the time (docs/guides/running.md: lag grows long
before the loop saturates), so a worker is planned for KEEP_SHARE of what it could do."""

from __future__ import annotations

import asyncio
import json
import math
import os
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from loadgen.backends import OpenAIBackend
from loadgen.records import RequestRecord
from loadgen.workload import RequestSpec

KEEP_SHARE = 0.5  # of a busy loop's rate, a worker is planned for this share
MEASURE_S = 0.5  # how long the measurement sends
IN_FLIGHT = 8  # requests the measurement keeps open at once
STREAM_TOKENS = 32


@dataclass(slots=True)
class WorkerChoice:
    """The N `--workers auto` picked, with the figures it came from (config.json keeps it)."""

    workers: int
    busiest_rate: float  # requests in the schedule's busiest second
    per_worker_rate: float  # what one worker is planned to keep (KEEP_SHARE of its capacity)
    cpu_s_per_request: float  # measured: the client's CPU per request
    cores: int  # this process may run on
    server_cores: int  # of those, taken by a bundled server on this machine
    needed: int  # workers the rate needs, before the cap of cores

    def reason(self) -> str:
        text = (
            f"--workers auto: {self.workers} worker process{'es' if self.workers > 1 else ''}"
            f" for a busiest second of {self.busiest_rate:.0f} requests; one worker keeps "
            f"~{self.per_worker_rate:.0f} req/s here (measured {self.cpu_s_per_request * 1e6:.0f}"
            f" us of client CPU a request, planned at {KEEP_SHARE:.0%} busy); {self.cores} "
            f"core{'s' if self.cores > 1 else ''} available"
        )
        if self.server_cores:
            text += f", {self.server_cores} left to the bundled server"
        if self.needed > self.workers:
            text += (
                f". The rate needs {self.needed}: too few cores, the run may fall behind its "
                "schedule (it says so: INVALID)"
            )
        return text


def busiest_second(offsets: Sequence[float]) -> float:
    """The most sends any one-second window of the schedule holds (a ramp's end, a trace's
    burst): what the workers must keep, not the mean."""
    if not offsets:
        return 0.0
    times = sorted(offsets)
    best, start = 1, 0
    for end, t in enumerate(times):
        while t - times[start] >= 1.0:
            start += 1
        best = max(best, end - start + 1)
    span = times[-1] - times[0]
    if span < 1.0 and span > 0:  # a schedule shorter than a second: its own rate
        return max(float(best), (len(times) - 1) / span)
    return float(best)


def usable_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def bundled_server_cores(cores: int) -> int:
    """The bundled engine's torch threads: OMP_NUM_THREADS where set, else every core."""
    given = os.environ.get("OMP_NUM_THREADS", "")
    return min(cores, int(given)) if given.isdigit() and int(given) > 0 else cores


def choose_workers(
    offsets: Sequence[float],
    cpu_s_per_request: float,
    cores: int,
    server_cores: int = 0,
) -> WorkerChoice:
    rate = busiest_second(offsets)
    per_worker = KEEP_SHARE / cpu_s_per_request
    needed = max(1, math.ceil(rate / per_worker))
    cap = max(1, cores - server_cores)
    return WorkerChoice(
        min(needed, cap), rate, per_worker, cpu_s_per_request, cores, server_cores, needed
    )


def resolve_workers(cfg: Any, offsets: Sequence[float] | None) -> WorkerChoice | None:
    """--workers auto made a number on `cfg` (None when it was one already). A bundled
    server started by this run shares the machine's cores; a server at a --base-url is
    taken to run elsewhere."""
    if cfg.workers != "auto":
        return None
    if offsets is None:  # a closed loop: check_split has refused it already
        raise ValueError("--workers auto: an open-loop schedule is needed")
    cores = usable_cores()
    bundled = not cfg.base_url
    choice = choose_workers(
        offsets, measure_cpu_per_request(), cores, bundled_server_cores(cores) if bundled else 0
    )
    cfg.workers = choice.workers
    return choice


def measure_cpu_per_request(seconds: float = MEASURE_S) -> float:
    """The client's CPU seconds a request, through the run's HTTP client and SSE parser."""
    server = _CannedServer()
    try:
        return asyncio.run(_send_for(server.url, seconds))
    finally:
        server.close()


async def _send_for(url: str, seconds: float) -> float:
    backend = OpenAIBackend(url, "capacity", tokenizer=None)
    await backend.start()
    spec = RequestSpec("hello " * 16, 16, STREAM_TOKENS)
    sent = 0

    async def one() -> None:
        nonlocal sent
        rec = RequestRecord(sent, f"c{sent}", 16, STREAM_TOKENS)
        sent += 1
        await backend.send(spec, rec, 0.0)
        if rec.status != "ok":
            raise RuntimeError(f"the capacity measurement's request failed: {rec.error}")

    async def sender(until: float) -> None:
        while time.perf_counter() < until:
            await one()

    try:
        await asyncio.gather(*(one() for _ in range(IN_FLIGHT)))  # connections opened
        sent, cpu0 = 0, time.thread_time()
        until = time.perf_counter() + seconds
        await asyncio.gather(*(sender(until) for _ in range(IN_FLIGHT)))
        return (time.thread_time() - cpu0) / max(sent, 1)
    finally:
        await backend.close()


class _CannedServer:
    """HTTP/1.1 keep-alive on 127.0.0.1, in a thread: every POST gets the same prepared
    stream of STREAM_TOKENS chunks, a usage chunk and [DONE], one write each."""

    def __init__(self) -> None:
        events = [_token(None)] * (STREAM_TOKENS - 1) + [_token("length")]
        usage = {"prompt_tokens": 16, "completion_tokens": STREAM_TOKENS, "total_tokens": 48}
        events += [_event({"choices": [], "usage": usage}), b"data: [DONE]\n\n"]
        self._events = events
        self._head = (
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
            b"Transfer-Encoding: chunked\r\nConnection: keep-alive\r\n\r\n"
        )
        self._loop = asyncio.new_event_loop()
        ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, args=(ready,), daemon=True)
        self._thread.start()
        ready.wait(10)
        self.url = f"http://127.0.0.1:{self._port}/v1"

    def _serve(self, ready: threading.Event) -> None:
        asyncio.set_event_loop(self._loop)
        start = asyncio.start_server(self._answer, "127.0.0.1", 0)
        self._server = self._loop.run_until_complete(start)
        self._port = self._server.sockets[0].getsockname()[1]
        ready.set()
        self._loop.run_forever()
        self._loop.close()

    async def _shutdown(self) -> None:
        self._server.close()
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while head := await reader.readuntil(b"\r\n\r\n"):
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                await reader.readexactly(length)
                writer.write(self._head)
                for event in self._events:
                    writer.write(b"%x\r\n%s\r\n" % (len(event), event))
                writer.write(b"0\r\n\r\n")
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop).result(5)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)


def _token(finish: str | None) -> bytes:
    return _event({"choices": [{"index": 0, "text": " tok", "finish_reason": finish}]})


def _event(body: dict) -> bytes:
    return b"data: " + json.dumps({"id": "c", "object": "chunk", **body}).encode() + b"\n\n"
