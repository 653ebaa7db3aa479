"""Does `bench run` disturb what it measures? The bundled engine's decode step times during a
run, against the same batches computed offline (no load generator beside it).

    python benchmarks/run_vs_offline.py                       # float32, concurrency 8
    python benchmarks/run_vs_offline.py --dtype bfloat16 --concurrency 4 --num-requests 32

It runs `bench run` against the bundled engine (a server process of its own; the load
generator is the neighbour) and reads the run's steps.jsonl: decode-only steps, grouped by how
many sequences they decoded (B). Then, in this process, an engine of the same model, dtype and
max_num_seqs decodes B sequences at the group's median context per sequence, `--offline-steps`
steps per group. Per B it prints both medians and their ratio; beyond `--tolerance` (10 %) it
says so. Rounds alternate
(a run, then its batches offline), and the ratio is the median of the rounds' ratios, so a
machine whose load drifts moves both sides alike. The server's OpenMP wait policy is printed
(engine/omp_wait.py)."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from child_procs import run_group
from decode_steps import DecodeSteps


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
    p.add_argument("--rounds", type=int, default=3, help="bench runs, each followed by offline")
    p.add_argument("--tolerance", type=float, default=0.10)
    p.add_argument("--omp-passive", choices=["auto", "0", "1"], default="auto",
                   help="SERVEBENCH_OMP_PASSIVE for the server and this process alike")  # fmt: skip
    args = p.parse_args()
    os.environ["SERVEBENCH_OMP_PASSIVE"] = args.omp_passive  # before torch; the server inherits
    import engine  # allocator and OpenMP settings before torch

    print(f"this process: OpenMP wait policy {engine.omp_wait.state.policy}")
    offline = DecodeSteps(args.model, args.dtype, args.concurrency)
    rows: dict[int, list[tuple[float, float]]] = {}  # B -> per round (run ms, offline ms)
    head = f"{'B':>3} {'steps':>6} {'run ms':>8} {'offline ms':>11} {'run/offline':>12}"
    print(f"{'round':>5} {head}")
    for r in range(args.rounds):
        with tempfile.TemporaryDirectory() as tmp:
            groups = decode_groups(run_steps(args, Path(tmp) / "run"), args.min_steps)
            log = (Path(tmp) / "run" / "server.log").read_text(errors="replace").splitlines()
        if r == 0:
            print(*[f"server: {line}" for line in log if "OpenMP wait policy" in line], sep="\n")
        if not groups:
            raise SystemExit(f"no B ran {args.min_steps}+ decode-only steps: more requests")
        for batch, group in groups.items():
            context = round(statistics.median(s["decode_context_tokens"] / batch for s in group))
            run_ms = statistics.median(s["dur_s"] * 1e3 for s in group)
            offline.fill(batch, max(context - 2, 1))  # then 2 steps: context tokens
            off_ms = offline.median_ms(args.offline_steps)
            rows.setdefault(batch, []).append((run_ms, off_ms))
            print(f"{r:5d} {batch:3d} {len(group):6d} {run_ms:8.1f} {off_ms:11.1f} "
                  f"{run_ms / off_ms:11.2f}x", flush=True)  # fmt: skip
    print("\nmedians over rounds (a round's run, then its offline steps)")
    print(head.replace(" steps", "rounds"))
    off = []
    for batch, pairs in sorted(rows.items()):
        run_ms = statistics.median(a for a, _ in pairs)
        off_ms = statistics.median(b for _, b in pairs)
        ratio = statistics.median(a / b for a, b in pairs)
        flag = "" if abs(ratio - 1) <= args.tolerance else f"  beyond {args.tolerance:.0%}"
        off += [batch] if flag else []
        print(f"{batch:3d} {len(pairs):6d} {run_ms:8.1f} {off_ms:11.1f} {ratio:11.2f}x{flag}")
    verdict = f"B = {off} beyond" if off else "all within"
    print(f"{verdict} {args.tolerance:.0%} (decode-only steps; context per sequence matched)")


if __name__ == "__main__":
    main()
