"""What one streamed request costs the load generator's CPU, beside the floor aiohttp sets.

Against the instant server (benchmarks/instant_server.py, pinned to the last core; the client
to the first), N requests of 32 one-token chunks at a fixed concurrency, two ways alternating
in each round:

- `aiohttp`: the floor. POST, read the stream to its end, nothing parsed or recorded.
- `ours`: `OpenAIBackend.send`, as `bench run` sends: the body built, every event parsed,
  the record filled (stamps, token counts, status).

Per round and way: CPU microseconds per request (the process's user + system time over N) and
wall microseconds per request; then the medians and ours/floor. The client's CPU per request
is what bounds its rate on a core and what queues a response behind other requests' work
(TTFT p99 at 1,000 req/s, issue 46).

Then the parse alone (no network), per stream: `send`'s handling of each read over a captured
stream, in one read (as the instant server writes it) and in one read per event (as a server
streaming token by token does), with this server's chunks and with vLLM-shaped ones.

    python benchmarks/loadgen_client_cost.py [--requests 4000] [--concurrency 8] [--rounds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import statistics
import sys
import time
import timeit
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from loadgen_capacity import mock_server

from loadgen.backends import OpenAIBackend
from loadgen.event_loop import run_event_loop
from loadgen.mock_server import _chunk, _usage
from loadgen.records import RequestRecord
from loadgen.workload import RequestSpec

CHUNKS = 32


async def _floor(url: str, n: int, concurrency: int) -> None:
    body = json.dumps({"model": "mock", "prompt": "x " * 16, "max_tokens": CHUNKS, "stream": True})
    headers = {"Content-Type": "application/json"}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:

        async def one() -> None:
            async with session.post(url + "/completions", data=body, headers=headers) as resp:
                async for _ in resp.content.iter_any():
                    pass

        await _closed_loop(one, n, concurrency)


async def _ours(url: str, n: int, concurrency: int) -> None:
    backend = OpenAIBackend(url, "mock", max_connections=0, timeout_s=60)
    await backend.start()
    spec = RequestSpec("x " * 16, 16, CHUNKS)
    failed = []

    async def one() -> None:
        rec = RequestRecord(0, "r", 16, CHUNKS)
        await backend.send(spec, rec, 0.0)
        if not rec.ok or rec.output_tokens != CHUNKS:
            failed.append(rec.error)

    try:
        await _closed_loop(one, n, concurrency)
    finally:
        await backend.close()
    if failed:
        raise RuntimeError(f"{len(failed)} requests failed: {failed[0]}")


async def _closed_loop(one, n: int, concurrency: int) -> None:
    left = iter(range(n))

    async def lane() -> None:
        for _ in left:
            await one()

    await asyncio.gather(*(lane() for _ in range(concurrency)))


def _cost(way, url: str, n: int, concurrency: int) -> tuple[float, float]:
    """CPU and wall microseconds per request."""
    run_event_loop(way(url, 200, concurrency))  # connections open, code warm
    cpu, wall = time.process_time(), time.perf_counter()
    run_event_loop(way(url, n, concurrency))
    return (time.process_time() - cpu) / n * 1e6, (time.perf_counter() - wall) / n * 1e6


def _streams() -> dict[str, bytes]:
    mock = b"".join(
        _chunk(False, " tok", "length" if k == CHUNKS - 1 else None) for k in range(CHUNKS)
    )

    def vllm(k: int) -> bytes:
        choice = {"index": 0, "text": " tok", "logprobs": None, "stop_reason": None}
        choice["finish_reason"] = "length" if k == CHUNKS - 1 else None
        body = {"id": "cmpl-8f1c2a3b4c5d6e7f8a9b0c1d2e3f4a5b", "object": "text_completion"}
        body |= {"created": 1765000000, "model": "HuggingFaceTB/SmolLM2-135M-Instruct"}
        body |= {"choices": [choice], "usage": None}
        return b"data: " + json.dumps(body).encode() + b"\n\n"

    tail = _usage(16, CHUNKS) + b"data: [DONE]\n\n"
    return {"this server's": mock + tail, "vLLM's": b"".join(map(vllm, range(CHUNKS))) + tail}


def _parse(backend: OpenAIBackend, reads: list[bytes]) -> RequestRecord:
    """What `OpenAIBackend.send` does with a stream's reads, without the network."""
    rec, texts, usage, finished, buf = RequestRecord(0, "r", 16, CHUNKS), [], {}, set(), b""
    for data in reads:
        buf, done = backend._feed(buf + data, 1.0, rec, texts, usage, finished)
        if done:
            break
    backend._keep_partial(rec, texts, usage)
    return rec


def parse_costs(rounds: int) -> None:
    backend = OpenAIBackend("http://127.0.0.1:1/v1", "mock")
    print("\nparse alone, microseconds per stream (min of each round's 2,000 parses):")
    for name, stream in _streams().items():
        ends = [m.end() for m in re.finditer(rb"\n\n", stream)]
        per_event = [stream[a:b] for a, b in zip([0, *ends[:-1]], ends, strict=True)]
        for shape, reads in (("one read", [stream]), ("a read per event", per_event)):
            rec = _parse(backend, reads)
            assert rec.output_tokens == CHUNKS and len(rec.chunk_s) == CHUNKS, rec
            per = [timeit.timeit(lambda r=reads: _parse(backend, r), number=2000) / 2000 * 1e6
                   for _ in range(rounds)]  # fmt: skip
            shown = " ".join(f"{x:.1f}" for x in per)
            print(f"  {name:14s} chunks, {shape:16s}: {min(per):6.1f}  (rounds {shown})")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--requests", type=int, default=4000)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--port", type=int, default=8197)
    args = p.parse_args()
    cores = sorted(os.sched_getaffinity(0))
    server_core = cores[-1] if len(cores) > 1 else None
    if server_core is not None:
        os.sched_setaffinity(0, {cores[0]})
    url = f"http://127.0.0.1:{args.port}/v1"
    where = "its own core" if server_core is not None else "the same cores"
    print(f"{args.requests} requests of {CHUNKS} chunks, concurrency {args.concurrency}; "
          f"client on core {cores[0]}, server on {where}")  # fmt: skip
    ways = {"aiohttp": _floor, "ours": _ours}
    cpu: dict[str, list[float]] = {w: [] for w in ways}
    wall: dict[str, list[float]] = {w: [] for w in ways}
    with mock_server(args.port, server_core, kind="instant"):
        for r in range(args.rounds):
            order = list(ways) if r % 2 == 0 else list(reversed(ways))
            for w in order:
                c, t = _cost(ways[w], url, args.requests, args.concurrency)
                cpu[w].append(c)
                wall[w].append(t)
            shown = [f"{w} {cpu[w][-1]:.0f} us CPU / {wall[w][-1]:.0f} us wall" for w in ways]
            print(f"round {r + 1}: " + ", ".join(shown))
    med = {w: statistics.median(cpu[w]) for w in ways}
    medw = {w: statistics.median(wall[w]) for w in ways}
    print(f"median CPU per request: aiohttp {med['aiohttp']:.0f} us, ours {med['ours']:.0f} us "
          f"(ours/floor {med['ours'] / med['aiohttp']:.2f}); wall {medw['aiohttp']:.0f} / "
          f"{medw['ours']:.0f} us")  # fmt: skip
    parse_costs(args.rounds)


if __name__ == "__main__":
    main()
