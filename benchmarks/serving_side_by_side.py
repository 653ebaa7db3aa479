"""`bench run` against `bench serve` and against `vllm serve`: the same weights, settings,
prompts and closed-loop load over HTTP, side by side in one run.

    python benchmarks/serving_side_by_side.py --vllm-python .venv-vllm/bin/python
    python benchmarks/serving_side_by_side.py --vllm-python ... --dtype bfloat16 \\
        --concurrency 1 8 32 --rounds 3

vLLM runs from its own virtual environment (make one with `python
benchmarks/vllm_side_by_side.py --setup-vllm-env DIR`) with the model exported as a Hugging
Face directory from our loader, every core bound to its worker as in vllm_side_by_side.py
(`--vllm-binding default` reserves its one core for the engine-core process). Each round
starts each server afresh, the order alternating between rounds, and runs one `bench run` per
concurrency against it (`--concurrency C --num-requests C x --waves`, warm-up requests first,
ignore_eos, greedy). Printed: per round and system, output tok/s, TTFT p50 and ITL p50; then
medians and ours / vLLM ratios (throughput: higher is better for us; latencies: vLLM / ours).
A run with a failed request stops the benchmark."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from child_procs import run_group
from vllm_side_by_side import vllm_env

from bench_cli.local_server import ServerProcess, ServerStartError, free_port

HERE = Path(__file__).resolve().parent
BENCH = [sys.executable, "-m", "bench_cli"]
METRICS = ("output tok/s", "TTFT p50 ms", "ITL p50 ms")


def server_cmd(system: str, args: argparse.Namespace, model_dir: Path, port: int) -> list[str]:
    common = ["--port", str(port), "--dtype", args.dtype, "--seed", "0",
              "--max-num-seqs", str(max(args.concurrency)),
              "--max-num-batched-tokens", str(args.max_num_batched_tokens),
              "--max-model-len", str(args.input_len + args.output_len)]  # fmt: skip
    if system == "ours":
        return [*BENCH, "serve", "--model", args.model, *common]
    return [args.vllm_python, "-m", "vllm.entrypoints.openai.api_server",
            "--model", str(model_dir), "--served-model-name", args.model, *common]  # fmt: skip


def load(args: argparse.Namespace, port: int, concurrency: int, out: Path) -> dict[str, float]:
    cmd = [*BENCH, "run", "--base-url", f"http://127.0.0.1:{port}/v1", "--model", args.model,
           "--tokenizer", args.model, "--concurrency", str(concurrency),
           "--num-requests", str(concurrency * args.waves), "--warmup", str(concurrency),
           "--input-len", str(args.input_len), "--output-len", str(args.output_len),
           "--ignore-eos", "--seed", "0", "--no-dashboard", "--out", str(out)]  # fmt: skip
    done = run_group(cmd, capture_output=True, text=True)
    summary = out / "summary.json"
    if not summary.is_file():
        raise SystemExit(f"bench run wrote no summary ({done.returncode}):\n{done.stderr[-2000:]}")
    s = json.loads(summary.read_text())
    if s["failed"] or s["completed"] != concurrency * args.waves:
        raise SystemExit(f"{out}: {s['completed']} completed, {s['failed']} failed")
    return {
        "output tok/s": s["output_throughput"],
        "TTFT p50 ms": s["ttft_s"]["p50"] * 1e3,
        "ITL p50 ms": s["itl_s"]["p50"] * 1e3,
    }


def serve_and_load(
    system: str, args: argparse.Namespace, model_dir: Path, workdir: Path, r: int
) -> dict[int, dict[str, float]]:
    port = free_port()
    log = workdir / f"{system}-{r}.log"
    server = ServerProcess(
        server_cmd(system, args, model_dir, port),
        log,
        [f"http://127.0.0.1:{port}/v1/models"],
        env=vllm_env(args) if system == "vllm" else None,
    )
    try:
        server.start(args.ready_timeout)
    except ServerStartError as e:
        raise SystemExit(f"{system} (log {log}): {e}") from None
    try:
        rows = {c: load(args, port, c, workdir / f"{system}-{r}-c{c}") for c in args.concurrency}
    finally:
        server.stop()
    ready_s = server.ready_s or 0.0
    cells = "; ".join(
        f"C={c} {m['output tok/s']:.0f} tok/s, TTFT {m['TTFT p50 ms']:.0f}, ITL "
        f"{m['ITL p50 ms']:.1f} ms"
        for c, m in rows.items()
    )
    print(f"round {r} {system:>5} (ready in {ready_s:.0f} s): {cells}", flush=True)
    return rows


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--vllm-python", required=True, help="the interpreter of a venv with vLLM")
    p.add_argument("--vllm-binding", choices=["all", "default"], default="all")
    p.add_argument("--vllm-kv-gb", type=int, default=2)
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--dtype", default="float32", choices=["bfloat16", "float32"])
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    p.add_argument("--waves", type=int, default=4, help="requests per run: C x waves")
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=64)
    p.add_argument("--max-num-batched-tokens", type=int, default=2048)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--ready-timeout", type=float, default=900)
    args = p.parse_args()

    # isort: off
    import engine  # noqa: F401 (first: allocator and OpenMP settings before torch)

    # isort: on
    import torch

    from engine.model.export import export_hf_dir
    from engine.model.loader import load_model

    print(f"{args.model} {args.dtype}, {os.cpu_count()} cores, concurrency {args.concurrency}, "
          f"{args.input_len} in / {args.output_len} out, vLLM binding "
          f"{args.vllm_binding}")  # fmt: skip
    results: dict[str, dict[int, list[dict[str, float]]]] = {"ours": {}, "vllm": {}}
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        dtype = getattr(torch, args.dtype)
        model_dir = export_hf_dir(load_model(args.model, dtype, torch.device("cpu")),
                                  workdir / "model")  # fmt: skip
        for r in range(args.rounds):
            for system in ("ours", "vllm") if r % 2 == 0 else ("vllm", "ours"):
                for c, m in serve_and_load(system, args, model_dir, workdir, r).items():
                    results[system].setdefault(c, []).append(m)
    report(args, results)


def report(args: argparse.Namespace, results: dict[str, dict[int, list[dict[str, Any]]]]) -> None:
    def med(system: str, c: int, metric: str) -> float:
        return statistics.median(m[metric] for m in results[system][c])

    print(f"\nmedians over {args.rounds} rounds ({args.dtype})")
    print(f"{'C':>3} {'system':>6} " + " ".join(f"{m:>13}" for m in METRICS))
    for c in args.concurrency:
        for system in ("ours", "vllm"):
            print(f"{c:3d} {system:>6} "
                  + " ".join(f"{med(system, c, m):13.1f}" for m in METRICS))  # fmt: skip
        tput = med("ours", c, METRICS[0]) / med("vllm", c, METRICS[0])
        lat = [med("vllm", c, m) / med("ours", c, m) for m in METRICS[1:]]
        print(f"{c:3d} {'ratio':>6} {tput:12.2f}x " + " ".join(f"{x:12.2f}x" for x in lat))


if __name__ == "__main__":
    main()
