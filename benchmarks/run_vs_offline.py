"""Does `bench run` disturb what it measures? The bundled engine's decode step times during a
run, against the same batches computed offline (no load generator beside it).

    python benchmarks/run_vs_offline.py                       # float32, concurrency 8
    python benchmarks/run_vs_offline.py --dtype bfloat16 --concurrency 4 --num-requests 32

It runs `bench run` against the bundled engine (a server process of its own; the load
generator is the neighbour) and reads the run's steps.jsonl: decode-only steps, grouped by how
many sequences they decoded (B). Then, in this process, an engine of the same model, dtype and
max_num_seqs decodes B sequences at the group's median context per sequence, `--offline-steps`
steps per group. Per B it prints both medians and their ratio; beyond `--tolerance` (10 %) it
says so. The offline steps are not interleaved with the run's, so a machine whose
load changes between the two halves shows up here too: one B is also timed offline before the
run, and the server's OpenMP wait policy is printed (engine/omp_wait.py)."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from child_procs import run_group


def run_steps(args: argparse.Namespace, out: Path) -> list[dict]:
    cmd = [str(Path(sys.executable).parent / "bench"), "run", "--model", args.model,
           "--dtype", args.dtype,
           "--concurrency", str(args.concurrency), "--max-num-seqs", str(args.concurrency),
           "--num-requests", str(args.num_requests), "--warmup", "0",
           "--input-len", str(args.input_len), "--output-len", str(args.output_len),
           "--no-dashboard", "--out", str(out)]  # fmt: skip
    print("+ bench", " ".join(cmd[1:]), flush=True)
    run_group(cmd, check=True, stdout=subprocess.DEVNULL)  # stops its bench serve too
    lines = (out / "steps.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def decode_groups(steps: list[dict], min_steps: int) -> dict[int, list[dict]]:
    """Decode-only steps by batch size, the groups with at least min_steps steps."""
    groups: dict[int, list[dict]] = {}
    for s in steps:
        if s["prefill_tokens"] == 0 and s["decode_tokens"] == s["seqs"] > 0:
            groups.setdefault(s["seqs"], []).append(s)
    return {b: g for b, g in sorted(groups.items()) if len(g) >= min_steps}


def offline_ms(args: argparse.Namespace, batch: int, context: int) -> list[float]:
    import torch

    from engine.config import EngineConfig
    from engine.core.request import SamplingParams
    from engine.engine import LLMEngine

    eng = LLMEngine(EngineConfig.from_kwargs(args.model, dtype=args.dtype,
                                             max_num_seqs=args.concurrency))  # fmt: skip
    vocab = eng.runner.model.config.vocab_size
    gen = torch.Generator().manual_seed(0)
    params = SamplingParams(max_tokens=args.offline_steps + 4, temperature=0.0, ignore_eos=True)
    for i in range(batch):
        prompt = torch.randint(0, vocab, (max(context - 2, 1),), generator=gen).tolist()
        eng.add(eng.make_request(f"r{i}", prompt, params))
    while eng.scheduler.num_waiting or any(not r.num_output_tokens for r in eng.scheduler.running):
        eng.step()
    eng.step()  # warm-up
    times = []
    for _ in range(args.offline_steps):
        t0 = time.perf_counter()
        eng.step()
        times.append((time.perf_counter() - t0) * 1e3)
    return times


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--num-requests", type=int, default=24)
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=64)
    p.add_argument("--min-steps", type=int, default=10, help="least decode steps of a B compared")
    p.add_argument("--offline-steps", type=int, default=20)
    p.add_argument("--tolerance", type=float, default=0.10)
    p.add_argument("--omp-passive", choices=["auto", "0", "1"], default="auto",
                   help="SERVEBENCH_OMP_PASSIVE for the server and this process alike")  # fmt: skip
    args = p.parse_args()
    os.environ["SERVEBENCH_OMP_PASSIVE"] = args.omp_passive  # before torch; the server inherits
    import engine  # allocator and OpenMP settings before torch

    print(f"this process: OpenMP wait policy {engine.omp_wait.state.policy}")
    context = args.input_len + args.output_len // 2
    before = statistics.median(offline_ms(args, args.concurrency, context))
    with tempfile.TemporaryDirectory() as tmp:
        groups = decode_groups(run_steps(args, Path(tmp) / "run"), args.min_steps)
        log = (Path(tmp) / "run" / "server.log").read_text(errors="replace").splitlines()
    print(*[f"server: {line}" for line in log if "OpenMP wait policy" in line], sep="\n")
    if not groups:
        raise SystemExit(f"no batch size ran {args.min_steps}+ decode-only steps: more requests")
    print(f"offline before the run: B={args.concurrency} at context {context}: {before:.1f} ms "
          f"(against the same after it: how much the machine's load moved)")  # fmt: skip
    print(f"\n{'B':>3} {'steps':>6} {'run ms':>8} {'offline ms':>11} {'run/offline':>12}")
    off = []
    for batch, group in groups.items():
        context = round(statistics.median(s["decode_context_tokens"] / batch for s in group))
        run_ms = statistics.median(s["dur_s"] * 1e3 for s in group)
        offline = statistics.median(offline_ms(args, batch, context))
        ratio = run_ms / offline
        flag = "" if abs(ratio - 1) <= args.tolerance else f"  beyond {args.tolerance:.0%}"
        off += [batch] if flag else []
        print(f"{batch:3d} {len(group):6d} {run_ms:8.1f} {offline:11.1f} {ratio:11.2f}x{flag}")
    verdict = f"B = {off} beyond" if off else "all within"
    print(f"{verdict} {args.tolerance:.0%} (decode-only steps; context per sequence matched)")


if __name__ == "__main__":
    main()
