"""Does the server's memory stop growing under steady load? A Poisson load of varied prompt and
output lengths against `bench serve` (started here, or any server at --base-url) for N minutes;
prints the server's RSS every --sample-s seconds (from /metrics' process_resident_memory_bytes),
its slope per minute over the first and the second half, KV blocks in use and errors.

    python benchmarks/soak.py --minutes 10          # SmolLM2, 0.8 req/s, 32-512 in, 8-96 out
    python benchmarks/soak.py --model tiny-smollm2 --rate 20 --minutes 3
    python benchmarks/soak.py --env SERVEBENCH_MALLOPT=0 --env MALLOC_ARENA_MAX=8

Prompts are random token ids (no tokenizer work), outputs forced to their length (ignore_eos)."""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench_cli.local_server import LocalServer
from loadgen.telemetry import parse_gauges
from loadgen.workload import LengthDist


async def scrape(session: aiohttp.ClientSession, metrics_url: str) -> dict[str, float]:
    async with session.get(metrics_url) as r:
        return parse_gauges(await r.text())


async def one_request(
    session: aiohttp.ClientSession, url: str, body: dict, counts: dict[str, int]
) -> None:
    try:
        async with session.post(url, json=body) as r:
            await r.read()
            key = "ok" if r.status == 200 else f"http {r.status}"
            counts[key] = counts.get(key, 0) + 1
    except (TimeoutError, aiohttp.ClientError) as e:
        key = type(e).__name__
        counts[key] = counts.get(key, 0) + 1


async def soak(args: argparse.Namespace, base_url: str) -> list[dict[str, float]]:
    rng = random.Random(args.seed)
    lengths = np.random.default_rng(args.seed)
    metrics_url = base_url.removesuffix("/v1") + "/metrics"
    timeout = aiohttp.ClientTimeout(total=600)
    counts: dict[str, int] = {"ok": 0}
    samples: list[dict[str, float]] = []
    tasks: set[asyncio.Task] = set()
    # No connection limit for the load (aiohttp's default of 100 would queue requests in this
    # client once the server falls behind), and its own session for /metrics, so a sample is
    # never stuck behind the load.
    connector = aiohttp.TCPConnector(limit=0)
    async with (
        aiohttp.ClientSession(timeout=timeout, connector=connector) as session,
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as probe,
    ):
        t0 = time.monotonic()
        end = t0 + args.minutes * 60
        next_sample = t0
        next_send = t0
        while time.monotonic() < end or tasks:
            now = time.monotonic()
            if now >= next_sample or (now >= end and not tasks):
                g = await scrape(probe, metrics_url)
                row = {"t_s": now - t0, "rss_mb": g.get("rss_bytes", float("nan")) / 2**20}
                row |= {"kv_blocks": g.get("kv_blocks_used", 0)}
                row |= {"done": sum(counts.values()), "errors": sum(counts.values()) - counts["ok"]}
                samples.append(row)
                print(
                    f"{row['t_s']:7.0f} s  RSS {row['rss_mb']:8.1f} MB  KV blocks "
                    f"{row['kv_blocks']:5.0f}  done {row['done']:5d}  errors {row['errors']}",
                    flush=True,
                )
                next_sample += args.sample_s
                if now >= end and not tasks:
                    break
            if now < end and now >= next_send:
                n_in = args.input_len.sample(lengths)
                prompt = [rng.randrange(100, 30000) for _ in range(n_in)]
                body = {
                    "model": args.served_name,
                    "prompt": prompt,
                    "max_tokens": args.output_len.sample(lengths),
                    "ignore_eos": True,
                    "stream": rng.random() < 0.5,
                    "temperature": rng.choice([0.0, 0.7]),
                }
                task = asyncio.create_task(
                    one_request(session, f"{base_url}/completions", body, counts)
                )
                tasks.add(task)
                task.add_done_callback(tasks.discard)
                next_send += rng.expovariate(args.rate)
            wake = min(next_sample, next_send if now < end else next_sample)
            await asyncio.sleep(max(0.0, min(wake - time.monotonic(), 0.5)))
    print("requests:", counts)
    return samples


def slope_mb_per_min(rows: list[dict[str, float]]) -> float:
    """Least-squares slope of RSS over time."""
    if len(rows) < 2:
        return float("nan")
    ts = [r["t_s"] / 60 for r in rows]
    ys = [r["rss_mb"] for r in rows]
    mt, my = sum(ts) / len(ts), sum(ys) / len(ys)
    var = sum((t - mt) ** 2 for t in ts)
    return sum((t - mt) * (y - my) for t, y in zip(ts, ys, strict=True)) / var if var else 0.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--base-url", help="an OpenAI-compatible server (with /metrics) to soak")
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--rate", type=float, default=0.8, help="requests per second (Poisson)")
    lengths = "tokens, as bench run takes them: N, uniform:lo:hi, normal:m:s, lognormal:m:s"
    ap.add_argument("--input-len", type=LengthDist.parse, default="uniform:32:512", help=lengths)
    ap.add_argument("--output-len", type=LengthDist.parse, default="uniform:8:96", help=lengths)
    ap.add_argument("--max-num-seqs", type=int, default=32)
    ap.add_argument("--sample-s", type=float, default=30.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--env", action="append", default=[], help="K=V for the server process")
    args = ap.parse_args()
    args.served_name = args.model
    for kv in args.env:
        key, value = kv.split("=", 1)
        os.environ[key] = value
    print(
        f"soak: {args.model}, {args.rate} req/s for {args.minutes} min, input "
        f"{args.input_len.kind} {args.input_len.a:g}/{args.input_len.b:g}, output "
        f"{args.output_len.kind} {args.output_len.a:g}/{args.output_len.b:g}, env "
        f"{args.env or 'as is'}"
    )
    if args.base_url:
        samples = asyncio.run(soak(args, args.base_url.rstrip("/")))
    else:
        log = Path(tempfile.mkdtemp()) / "server.log"
        engine = {"max_num_seqs": args.max_num_seqs}
        with LocalServer(args.model, engine, log) as server:
            samples = asyncio.run(soak(args, server.base_url))
    half = len(samples) // 2
    first, second = samples[: half + 1], samples[half:]
    print(
        f"RSS {samples[0]['rss_mb']:.0f} -> {samples[-1]['rss_mb']:.0f} MB; slope "
        f"{slope_mb_per_min(first):+.1f} MB/min in the first half, "
        f"{slope_mb_per_min(second):+.1f} MB/min in the second"
    )


if __name__ == "__main__":
    main()
