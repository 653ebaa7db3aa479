"""How fast the simulation runs: wall seconds per simulated second of the issue's load (Poisson
100 req/s, 256-token prompts, 128-token outputs, Llama-3.1-8B on a simulated H100, up to 256
running), with the fast paths (lazy decodes, decode stretches) and without (every request
visited every step), in turn, each in its own process on one core (taskset -c 0 where there
is one). Whole `bench run`s: planning, the run, records, summary and report. Prints wall time,
peak memory, and the ratio; run it alone on a quiet machine.

    python benchmarks/sim_speed.py [--duration 60] [--rounds 2] [--paths fast,stepping]
    python benchmarks/sim_speed.py --duration 3600 --rounds 1 --paths fast   # the hour
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

LOAD = [
    "--engine", "sim", "--sim-device", "h100", "--model", "meta-llama/Llama-3.1-8B",
    "--rate", "100", "--input-len", "256", "--output-len", "128", "--max-num-seqs", "256",
    "--no-dashboard",
]  # fmt: skip
# The CLI with the fast paths switched off or on (SimBackend.fast_forward).
RUN = (
    "import sys; from loadgen.sim_backend import SimBackend; SimBackend.fast_forward = {fast}; "
    "from bench_cli.app import app; sys.argv = ['bench', 'run', *sys.argv[1:]]; app()"
)


def run(path: str, duration: float, out: Path) -> dict[str, float]:
    code = RUN.format(fast=path == "fast")
    cmd = [sys.executable, "-c", code, *LOAD, "--duration", str(duration), "--out", str(out)]
    if shutil.which("taskset"):
        cmd = ["taskset", "-c", "0", *cmd]
    log = out.with_suffix(".log")
    t = time.perf_counter()
    with log.open("w") as f:
        child = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(child.pid, 0)  # this child's own peak memory
    wall = time.perf_counter() - t
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{path}: bench run failed\n{log.read_text()[-3000:]}")
    summary = json.loads((out / "summary.json").read_text())
    return {
        "wall_s": wall,
        "peak_gb": usage.ru_maxrss / 1e6,  # KiB on Linux
        "completed": summary["completed"],
        "tokens": summary["total_output_tokens"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--duration", type=float, default=60.0, help="simulated seconds a run")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--paths", default="fast,stepping", help="fast, stepping or both, in turn")
    args = ap.parse_args()
    paths = args.paths.split(",")
    tmp = Path(tempfile.mkdtemp(prefix="sim-speed-"))
    results: dict[str, list[dict[str, float]]] = {p: [] for p in paths}
    try:
        for i in range(args.rounds):
            for path in paths:
                r = run(path, args.duration, tmp / f"{path}-{i}")
                results[path].append(r)
                print(
                    f"round {i + 1} {path:9s} {r['wall_s']:7.1f} s wall, "
                    f"{args.duration / r['wall_s']:6.1f} simulated s a second, "
                    f"peak {r['peak_gb']:.2f} GB, {r['completed']} requests, "
                    f"{r['tokens']} tokens",
                    flush=True,
                )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    best = {p: min(r["wall_s"] for r in rs) for p, rs in results.items()}
    print(f"\n{args.duration:.0f} simulated s of 100 req/s (best of {args.rounds}):")
    for path, wall in best.items():  # start-up (~3 s) included: time an hour with --duration
        print(f"  {path:9s} {wall:7.1f} s wall, {args.duration / wall:6.1f} simulated s a second")
    counts = {(r["completed"], r["tokens"]) for rs in results.values() for r in rs}
    if len(counts) > 1:
        print(f"  WARNING: the runs differ in what they served: {sorted(counts)}")
    if "fast" in best and "stepping" in best:
        print(f"  fast paths: {best['stepping'] / best['fast']:.2f}x faster than stepping")


if __name__ == "__main__":
    main()
