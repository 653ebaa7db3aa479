"""Why the server must step the engine on the only thread with an OpenMP pool: decode step
times of one engine stepped on the thread that built it, on a second thread while the first
keeps its pool (the server before 2026-12-07), and on a second thread after the first let go
of its pool (`omp_wait.release_thread_pool`, what the server does now).

    python benchmarks/openmp_pools.py                    # float32, B = 1 and 8, 3 rounds
    python benchmarks/openmp_pools.py --dtype bfloat16 --batch 8 32

libgomp spins GOMP_SPINCOUNT times only while it manages no more threads than CPUs; each
thread that ran a parallel region keeps a pool, so a second pool (on 2 cores: 4 threads)
throttles every idle thread to 100 spins and each region sleeps and wakes. The three ways
alternate within each round; ratios are against the building thread's steps."""

from __future__ import annotations

import argparse
import statistics
import threading
from collections.abc import Callable


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    p.add_argument("--context", type=int, default=160, help="tokens per sequence")
    p.add_argument("--steps", type=int, default=30, help="decode steps timed per way and round")
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()

    # isort: off
    import engine  # first: allocator and OpenMP settings before torch

    # isort: on
    import torch
    from decode_steps import DecodeSteps

    print(f"OpenMP wait policy {engine.omp_wait.state.policy}, {torch.get_num_threads()} threads")
    bench = DecodeSteps(args.model, args.dtype, max(args.batch))

    def steps_ms() -> float:
        return bench.median_ms(args.steps)

    def on_thread(fn: Callable[[], float]) -> float:
        out: list[float] = []
        thread = threading.Thread(target=lambda: out.append(fn()))
        thread.start()
        thread.join()  # the thread's pool goes with it
        return out[0]

    def second_thread_beside_a_pool() -> float:
        bench.eng.step()  # the building thread runs a region: its pool is there
        return on_thread(steps_ms)

    def second_thread_alone() -> float:
        bench.eng.step()
        engine.omp_wait.release_thread_pool()
        return on_thread(steps_ms)

    ways = {
        "building thread": steps_ms,
        "2nd thread, 1st keeps pool": second_thread_beside_a_pool,
        "2nd thread, 1st released": second_thread_alone,
    }
    results: dict[tuple[int, str], list[float]] = {}
    for r in range(args.rounds):
        for batch in args.batch:
            bench.fill(batch, args.context)
            line = []
            for name, way in ways.items():
                ms = way()
                results.setdefault((batch, name), []).append(ms)
                line.append(f"{name} {ms:.1f}")
            print(f"round {r} B={batch}: " + " | ".join(line) + " ms", flush=True)

    print(f"\nmedian decode step (ms) over {args.rounds} rounds, {args.dtype}")
    print(f"{'B':>3} " + " ".join(f"{name:>28}" for name in ways))
    for batch in args.batch:
        base = statistics.median(results[(batch, "building thread")])
        cells = []
        for name in ways:
            ms = statistics.median(results[(batch, name)])
            cells.append(f"{ms:8.1f} ({ms / base:4.2f}x)".rjust(28))
        print(f"{batch:3d} " + " ".join(cells))


if __name__ == "__main__":
    main()
