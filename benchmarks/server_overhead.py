"""What the HTTP layer costs: one workload offline (`LLM.generate`) and through `bench serve`
(streaming, all requests sent at once so the server is saturated), side by side.

    python benchmarks/server_overhead.py                      # 64 x (128 in, 64 out), 32 seats
    python benchmarks/server_overhead.py --num-prompts 32 --output-len 32

Both sides use the same engine settings and token-id prompts; outputs are forced to their
length (ignore_eos)."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from child_procs import group_child

# isort: off
import engine  # noqa: F401 (first: it tunes glibc's allocator before torch allocates)

# isort: on
import aiohttp
import torch

from bench_cli.local_server import free_port
from engine.resolve import resolve_device, resolve_dtype


def offline_runner(args: argparse.Namespace, prompts: list[list[int]]) -> Callable[[], float]:
    from engine import LLM, SamplingParams

    llm = LLM(args.model, dtype=args.dtype, max_num_seqs=args.max_num_seqs)
    params = SamplingParams(max_tokens=args.output_len, temperature=0.0, ignore_eos=True)
    llm.generate(prompts[:2], SamplingParams(max_tokens=2, temperature=0.0))

    def run() -> float:
        t0 = time.perf_counter()
        llm.generate(prompts, params)
        return time.perf_counter() - t0

    return run


async def one(session: aiohttp.ClientSession, url: str, prompt: list[int], n: int) -> int:
    body = {"prompt": prompt, "max_tokens": n, "temperature": 0, "ignore_eos": True, "stream": True}
    body["stream_options"] = {"include_usage": True}
    tokens = 0
    async with session.post(url, json=body) as r:
        r.raise_for_status()
        async for line in r.content:
            if line.startswith(b"data: {"):
                usage = json.loads(line[6:]).get("usage")
                if usage:
                    tokens = usage["completion_tokens"]
    return tokens


async def through_http(base: str, prompts: list[list[int]], n: int) -> float:
    timeout = aiohttp.ClientTimeout(total=3600)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        await one(session, f"{base}/v1/completions", prompts[0][:8], 2)  # warm-up
        t0 = time.perf_counter()
        done = await asyncio.gather(
            *(one(session, f"{base}/v1/completions", p, n) for p in prompts)
        )
        seconds = time.perf_counter() - t0
    assert done == [n] * len(prompts), "every request must return its full output"
    return seconds


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--dtype", default="auto", choices=["auto", "bfloat16", "float32"])
    p.add_argument("--num-prompts", type=int, default=64)
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=64)
    p.add_argument("--max-num-seqs", type=int, default=32)
    p.add_argument("--repeat", type=int, default=2, help="interleaved runs of each side")
    args = p.parse_args()
    # One concrete dtype for every side (auto: bf16 only where the CPU runs it natively).
    args.dtype = resolve_dtype(args.dtype, resolve_device("auto"))
    g = torch.Generator().manual_seed(0)
    prompts = [
        torch.randint(17, 49152, (args.prompt_len,), generator=g).tolist()
        for _ in range(args.num_prompts)
    ]
    bench = shutil.which("bench") or str(Path(sys.executable).parent / "bench")
    port = free_port()
    cmd = [bench, "serve", "--model", args.model, "--dtype", args.dtype, "--port", str(port)]
    cmd += ["--max-num-seqs", str(args.max_num_seqs)]
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
    with group_child(cmd, env=os.environ.copy(), **quiet) as server:  # stopped on any exit
        base = f"http://127.0.0.1:{port}"
        deadline = time.time() + 300
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    break
            except OSError:
                if time.time() > deadline or server.poll() is not None:
                    raise SystemExit("the server did not start") from None
                time.sleep(0.5)
        offline = offline_runner(args, prompts)  # the server idles meanwhile
        http_runs, offline_runs = [], []
        for _ in range(args.repeat):  # interleaved, so drift on a shared machine hits both
            http_runs.append(asyncio.run(through_http(base, prompts, args.output_len)))
            offline_runs.append(offline())
    offline_s, http_s = min(offline_runs), min(http_runs)
    n_out = args.num_prompts * args.output_len
    threads = torch.get_num_threads()
    print(
        f"{args.num_prompts} prompts x {args.prompt_len} tokens -> {args.output_len} tokens, "
        f"max_num_seqs={args.max_num_seqs}, {args.model} {args.dtype}, {threads} threads"
    )
    for name, best, all_runs in (
        ("offline LLM.generate", offline_s, offline_runs),
        ("HTTP (bench serve)  ", http_s, http_runs),
    ):
        listed = ", ".join(f"{x:.1f}" for x in all_runs)
        print(f"{name}: best {best:6.1f} s  {n_out / best:6.1f} out tok/s  (runs: {listed} s)")
    print(f"HTTP / offline throughput (best runs): {offline_s / http_s:.3f}")


if __name__ == "__main__":
    main()
