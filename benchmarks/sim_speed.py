"""How fast the simulation runs: wall seconds per simulated second of the issue's load (Poisson
100 req/s, 256-token prompts, 128-token outputs, Llama-3.1-8B on a simulated H100, up to 256
running), with the fast paths (lazy decodes, decode stretches) and without (every request
visited every step), in turn, each in its own process on one core (taskset -c 0 where there
is one). Whole `bench run`s: planning, the run, records, summary and report. Prints wall time,
peak memory, and the ratio; run it alone on a quiet machine.

`engine` times the simulated engine alone on the same load: SimEngine with its fast path,
driven by a bare loop (arrivals added before each step, the clock moved on by each step's
time), its step log written, and nothing of the load generator: no event loop, records,
summary or report, prompts made outside the timing. What the engine's own Python costs, the
floor under any whole run on this core.

    python benchmarks/sim_speed.py [--duration 60] [--rounds 2] [--paths fast,stepping]
    python benchmarks/sim_speed.py --duration 3600 --rounds 1 --paths fast,engine   # the hour
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

from child_procs import group_child

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


def engine_alone(duration: float, out: Path) -> None:
    """The engine's share of LOAD (a child process): writes summary.json as a run would,
    with `engine_cpu_s`, the CPU its steps and admissions took."""
    import numpy as np

    from engine.config import EngineConfig
    from engine.core.request import SamplingParams
    from engine.model.shapes import model_shape
    from engine.sim.clock import VirtualClock
    from engine.sim.hardware import builtin_device
    from engine.sim.sim_engine import (
        SimEngine,
        resolve_sim_config,
        size_gpu_kv_cache,
        step_model_for,
    )
    from loadgen.virtual_loop import without_cyclic_gc

    model_name = "meta-llama/Llama-3.1-8B"
    config = EngineConfig.from_kwargs(model_name, max_num_seqs=256)
    model, device = model_shape(model_name), builtin_device("h100")
    resolve_sim_config(config, device)
    size_gpu_kv_cache(config, model, device)
    clock = VirtualClock()
    step_model = step_model_for("roofline", model, config, device)
    engine = SimEngine(config, model, step_model, clock)
    engine.lazy_decodes(lambda req, first, stop: None)  # as SimBackend.fast_forward
    out.mkdir(parents=True)
    engine.log_steps(out / "steps.jsonl")
    rng = np.random.default_rng(0)
    arrivals = np.cumsum(rng.exponential(1 / 100, int(duration * 110) + 100))
    arrivals = arrivals[arrivals < duration].tolist()
    params = SamplingParams(max_tokens=128, ignore_eos=True)
    prompts_s, done = 0.0, 0
    with without_cyclic_gc():
        start = time.process_time()
        for i, t in enumerate(arrivals):
            while clock.now < t:  # steps until the request arrives (or idle until it does)
                if not engine.has_unfinished_requests():
                    clock.advance_to(t)
                    break
                done += sum(o.finished for o in engine.step())
                clock.advance_to(clock.now + engine.last_step_s)
            made = time.process_time()
            ids = rng.integers(300, 40_000, 256).tolist()  # as the run's: 256 tokens, no BOS
            prompts_s += time.process_time() - made
            engine.add(engine.make_request(str(i), ids, params, t, 0, True))
        while engine.has_unfinished_requests():
            done += sum(o.finished for o in engine.step())
            clock.advance_to(clock.now + engine.last_step_s)
        cpu = time.process_time() - start - prompts_s
    engine.log_steps(None)
    summary = {
        "completed": done,
        "total_output_tokens": engine._counters["generation_tokens"],
        "steps": engine._counters["steps"],
        "engine_cpu_s": cpu,
    }
    (out / "summary.json").write_text(json.dumps(summary))


def run(path: str, duration: float, out: Path) -> dict[str, float]:
    code = RUN.format(fast=path == "fast")
    cmd = [sys.executable, "-c", code, *LOAD, "--duration", str(duration), "--out", str(out)]
    if path == "engine":
        cmd = [sys.executable, __file__, "--engine-alone", str(duration), str(out)]
    if shutil.which("taskset"):
        cmd = ["taskset", "-c", "0", *cmd]
    log = out.with_suffix(".log")
    t = time.perf_counter()
    with log.open("w") as f, group_child(cmd, stdout=f, stderr=subprocess.STDOUT) as child:
        _, status, usage = os.wait4(child.pid, 0)  # this child's own peak memory
        child.returncode = os.waitstatus_to_exitcode(status)  # reaped here, not by Popen
    wall = time.perf_counter() - t
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{path}: bench run failed\n{log.read_text()[-3000:]}")
    summary = json.loads((out / "summary.json").read_text())
    return {
        "wall_s": summary.get("engine_cpu_s", wall),  # the engine alone: its own CPU
        "peak_gb": usage.ru_maxrss / 1e6,  # KiB on Linux
        "completed": summary["completed"],
        "tokens": summary["total_output_tokens"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--duration", type=float, default=60.0, help="simulated seconds a run")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument(
        "--paths", default="fast,stepping", help="any of fast, stepping and engine, in turn"
    )
    ap.add_argument("--engine-alone", nargs=2, help=argparse.SUPPRESS)  # the child's
    args = ap.parse_args()
    if args.engine_alone:
        return engine_alone(float(args.engine_alone[0]), Path(args.engine_alone[1]))
    paths = args.paths.split(",")
    if unknown := set(paths) - {"fast", "stepping", "engine"}:
        ap.error(f"--paths: unknown {sorted(unknown)}")
    tmp = Path(tempfile.mkdtemp(prefix="sim-speed-"))
    results: dict[str, list[dict[str, float]]] = {p: [] for p in paths}
    try:
        for i in range(args.rounds):
            for path in paths:
                r = run(path, args.duration, tmp / f"{path}-{i}")
                results[path].append(r)
                print(
                    f"round {i + 1} {path:9s} {r['wall_s']:7.1f} s {_what(path)}, "
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
        print(
            f"  {path:9s} {wall:7.1f} s {_what(path)}, "
            f"{args.duration / wall:6.1f} simulated s a second"
        )
    # The engine alone draws its own arrivals and prompts: the same load, not the same requests.
    counts = {
        (r["completed"], r["tokens"]) for p, rs in results.items() if p != "engine" for r in rs
    }
    if len(counts) > 1:
        print(f"  WARNING: the runs differ in what they served: {sorted(counts)}")
    if "fast" in best and "stepping" in best:
        print(f"  fast paths: {best['stepping'] / best['fast']:.2f}x faster than stepping")
    if "fast" in best and "engine" in best:
        print(
            f"  the engine alone is {best['engine'] / best['fast']:.0%} of the whole fast run; "
            f"the rest (load generator, records, summary, report, start-up) "
            f"{best['fast'] - best['engine']:.1f} s"
        )


def _what(path: str) -> str:
    return "of the engine's CPU" if path == "engine" else "wall"


if __name__ == "__main__":
    main()
