"""The measurements of benchmarks/gpu_check.sh, printed as one block a person can paste into a
note. Every section runs in its own try block (one failure does not hide the others) and
says what it skipped and why; without CUDA, the GPU-only sections are skipped by name.

    python benchmarks/gpu_check.py [--out DIR] [--quick]

Sections: device peak; decode attention bandwidth (Triton kernel vs the torch path) at
B x context; fused vs unfused add+RMSNorm and RoPE; engine throughput of SmolLM2 bf16 at
B = 1, 32, 256 (torch backend, Triton backend, Triton + CUDA graphs), with greedy agreement;
MFU and MBU per step of a decode-heavy and a prefill-heavy run; fp8 linear vs bf16
(benchmarks/fp8_matmul.py); `bench profile` of a 32-sequence decode step per backend; a
one-minute `bench run` with the NVML timeline columns."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from child_procs import run_group

CUDA = torch.cuda.is_available()
ROOT = Path(__file__).resolve().parent.parent


def section(title: str) -> None:
    print(f"\n== {title}", flush=True)


def skipped(what: str) -> None:
    print(f"SKIPPED {what}: no CUDA device", flush=True)


def gpu_ms(fn: Callable[..., Any], *args: Any, repeats: int = 20) -> float:
    """Median time of fn(*args) on the GPU in ms (CUDA events), after a warm-up call."""
    fn(*args)
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn(*args)
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def peak_section() -> dict[str, Any]:
    from bench_cli.device_peak import device_peak

    device = "cuda" if CUDA else "cpu"
    dtype = torch.bfloat16 if CUDA else torch.float32
    peak = device_peak(device, dtype)
    name = torch.cuda.get_device_name() if CUDA else "CPU"
    print(f"device: {name}; torch {torch.__version__}", end="")
    try:
        import triton

        print(f", triton {triton.__version__}")
    except ImportError:
        print(", triton not installed")
    print(
        f"peak ({peak['dtype']}, {'cached' if peak.get('cached') else 'measured now'}): matmul "
        f"{peak['peak_flops'] / 1e12:.1f} TFLOP/s, copy {peak['peak_bytes_per_s'] / 1e9:.0f} "
        f"GB/s (read + write), read {peak['peak_read_bytes_per_s'] / 1e9:.0f} GB/s"
    )
    return peak


def attention_section(peak: dict[str, Any], quick: bool) -> None:
    """Decode attention over a paged bf16 cache with Llama-3-8B's attention shape (32 query
    heads, 8 KV heads, head_dim 128): K+V bytes read / kernel time, against the read peak and
    the copy bandwidth (read + write bytes of a copy per second)."""
    if not CUDA:
        return skipped("decode attention bandwidth")
    import numpy as np

    from engine import ops
    from engine.ops import AttentionMetadata, KVCache
    from engine.ops import triton as kernels

    heads, kv_heads, dim, bs = 32, 8, 128, 16
    from engine.ops.triton.attention import _segments

    print(f"{'batch':>6} {'context':>8} {'slices':>6} {'triton ms':>10} {'GB/s':>7} "
          f"{'% read peak':>11} {'% copy':>7} {'torch ms':>9} {'speed-up':>8}")  # fmt: skip
    for batch in (1, 32) if quick else (1, 32, 256):
        for context in (512, 4096):
            nb = context // bs
            pool = batch * nb
            shape = (kv_heads, pool, bs, dim)
            kv = [torch.randn(shape, device="cuda", dtype=torch.bfloat16) for _ in "kv"]
            cache = KVCache(*kv)
            tables = np.random.permutation(pool).reshape(batch, nb)
            starts = np.full(batch, context - 1)
            meta = AttentionMetadata.build(starts, np.ones(batch, dtype=np.int64), tables, bs,
                                           torch.device("cuda"))  # fmt: skip
            q = torch.randn(batch, heads, dim, device="cuda", dtype=torch.bfloat16)
            t_triton = gpu_ms(kernels.paged_attention, q, cache, meta, dim**-0.5)
            t_torch = gpu_ms(ops.paged_attention, q, cache, meta, dim**-0.5, repeats=5)
            moved = 2 * batch * context * kv_heads * dim * 2
            rate = moved / t_triton / 1e6
            slices = _segments(batch, batch, kv_heads, q.device)
            print(f"{batch:>6} {context:>8} {slices:>6} {t_triton:>10.3f} {rate:>7.0f} "
                  f"{rate * 1e9 / peak['peak_read_bytes_per_s']:>11.0%} "
                  f"{rate * 1e9 / peak['peak_bytes_per_s']:>7.0%} {t_torch:>9.3f} "
                  f"{t_torch / t_triton:>7.1f}x")  # fmt: skip


def fused_section() -> None:
    if not CUDA:
        return skipped("fused vs unfused add+RMSNorm and RoPE")
    from engine import ops
    from engine.ops import triton as kernels

    bf16 = {"device": "cuda", "dtype": torch.bfloat16}
    for tokens, hidden in ((256, 4096), (8192, 4096)):
        x, r = torch.randn(tokens, hidden, **bf16), torch.randn(tokens, hidden, **bf16)
        w = torch.randn(hidden, **bf16)
        fused = gpu_ms(kernels.add_rms_norm, x, r, w, 1e-5)
        unfused = gpu_ms(ops.add_rms_norm, x, r, w, 1e-5)
        print(f"add+RMSNorm [{tokens}, {hidden}]: fused {fused:.3f} ms, torch ops "
              f"{unfused:.3f} ms ({unfused / fused:.1f}x)")  # fmt: skip
    for tokens in (256, 8192):
        q = torch.randn(tokens, 32, 128, **bf16)
        k = torch.randn(tokens, 8, 128, **bf16)
        cos_sin = ops.rotary_cos_sin(128, tokens, 500000.0, torch.bfloat16, torch.device("cuda"))
        fused = gpu_ms(kernels.rotary_qk, q, k, cos_sin)
        unfused = gpu_ms(ops.rotary_qk, q, k, cos_sin)
        print(f"RoPE on Q and K, {tokens} tokens x (32 + 8) heads x 128: fused in place "
              f"{fused:.3f} ms, torch ops {unfused:.3f} ms ({unfused / fused:.1f}x)")  # fmt: skip


def generate(batch: int, prompt_len: int, output_len: int, steps_file: Path | None = None,
             **engine_args: Any) -> tuple[float, list[list[int]], Any]:  # fmt: skip
    """Output tok/s of `batch` random prompts, all admitted at once, forced to output_len."""
    from engine import LLM, SamplingParams

    llm = LLM("smollm2-135m", max_num_seqs=max(batch, 1), **engine_args)
    gen = torch.Generator().manual_seed(0)
    vocab = llm.llm_engine.model_config.vocab_size
    prompts = torch.randint(100, vocab - 100, (batch, prompt_len), generator=gen).tolist()
    params = SamplingParams(max_tokens=output_len, temperature=0.0, ignore_eos=True)
    llm.generate(prompts[:1], SamplingParams(max_tokens=2, ignore_eos=True))  # warm-up
    if steps_file is not None:
        llm.llm_engine.log_steps(steps_file)
    t0 = time.perf_counter()
    outs = llm.generate(prompts, params)
    elapsed = time.perf_counter() - t0
    llm.llm_engine.log_steps(None)
    return batch * output_len / elapsed, [o.outputs[0].token_ids for o in outs], llm


def throughput_section(quick: bool) -> None:
    if not CUDA:
        return skipped("engine throughput torch vs Triton backend (on CPU Triton is interpreted)")
    paths = {
        "torch": {"attention_backend": "torch"},
        "triton": {"attention_backend": "triton"},
        "triton+graphs": {"attention_backend": "triton", "cuda_graphs": True},
    }
    print("SmolLM2-135M bf16, prompts of 128 tokens, 64 output tokens each, output tok/s:")
    for batch in (1, 32) if quick else (1, 32, 256):
        rates, outputs = {}, {}
        for name, args in paths.items():
            try:
                rates[name], outputs[name], _ = generate(batch, 128, 64, dtype="bfloat16", **args)
            except Exception as e:
                print(f"  B={batch} {name}: failed: {e!r}")
        agree = {n: sum(a == b for o, r in zip(outputs[n], outputs["torch"], strict=True)
                        for a, b in zip(o, r, strict=True)) / (batch * 64)
                 for n in outputs if "torch" in outputs}  # fmt: skip
        row = ", ".join(f"{n} {r:.0f}" for n, r in rates.items())
        ratio = rates.get("triton", 0) / rates["torch"] if "torch" in rates else float("nan")
        same = ", ".join(f"{n} {a:.0%}" for n, a in agree.items())
        print(f"  B={batch}: {row} (triton / torch {ratio:.2f}x); greedy tokens equal to the "
              f"torch backend's: {same}")  # fmt: skip


def utilization_section(peak: dict[str, Any], out: Path) -> None:
    """Time-weighted MFU (model FLOP/s / matmul peak) and MBU (bytes/s / read peak) of the
    steps of a decode-heavy and a prefill-heavy run (the engine's own per-step counts)."""
    from bench_cli.claims.utilization import utilization

    dtype = "bfloat16" if CUDA else "float32"
    backend = "triton" if CUDA else "torch"
    cases = {  # (batch, prompt, output)
        "decode-heavy": (32, 128, 128) if CUDA else (8, 64, 24),
        "prefill-heavy": (8, 2048, 2) if CUDA else (2, 512, 2),
    }
    for name, (batch, prompt, output) in cases.items():
        steps_file = out / f"steps-{name}.jsonl"
        _, _, llm = generate(batch, prompt, output, steps_file, dtype=dtype,
                             attention_backend=backend)  # fmt: skip
        steps = [json.loads(x) for x in steps_file.read_text().splitlines()]
        cfg = llm.llm_engine.model_config
        u = utilization(steps, cfg, peak, 2.0, 2.0, skip_first=0)["all"]  # warmed up
        mbu = u["bytes_per_s"] / peak["peak_read_bytes_per_s"]
        print(f"{name} ({batch} x ({prompt} in, {output} out), {backend} backend, {dtype}): "
              f"{u['steps']} steps, {u['flops_per_s'] / 1e12:.3f} TFLOP/s = MFU {u['mfu']:.1%}, "
              f"{u['bytes_per_s'] / 1e9:.0f} GB/s = MBU {mbu:.0%} of read peak")  # fmt: skip


def fp8_section(quick: bool) -> None:
    args = ["--models", "smollm2,7b" if CUDA else "smollm2"]
    args += ["--tokens", "1,32,256" if CUDA and not quick else "1,32"]
    run = run_group([sys.executable, str(ROOT / "benchmarks" / "fp8_matmul.py"), *args],
                    capture_output=True, text=True, timeout=240)  # fmt: skip
    print(run.stdout.strip() or run.stderr.strip()[-2000:])


def profile_section(out: Path) -> None:
    """Where a decode step's time goes on the GPU, torch backend beside the Triton one."""
    if not CUDA:
        return skipped("bench profile on the GPU")
    for backend in ("torch", "triton"):
        cmd = [sys.executable, "-m", "bench_cli", "profile", "--batch", "32", "--context", "512",
               "--steps", "10", "--dtype", "bfloat16", "--attention-backend", backend,
               "--out", str(out / f"profile-{backend}")]  # fmt: skip
        run = run_group(cmd, capture_output=True, text=True, timeout=300)
        print(f"-- bench profile, {backend} backend:")
        print("\n".join(run.stdout.strip().splitlines()[-20:]) or run.stderr.strip()[-1500:])


def bench_run_section(out: Path, quick: bool) -> None:
    if not CUDA:
        return skipped("bench run with NVML columns (no driver: NVML cannot start)")
    import pandas as pd

    run_dir = out / "bench-run"
    seconds = 20 if quick else 60
    cmd = [sys.executable, "-m", "bench_cli", "run", "--model", "smollm2-135m", "--rate", "16",
           "--duration", str(seconds), "--input-len", "256", "--output-len", "64",
           "--no-dashboard", "--out", str(run_dir), "--attention-backend", "triton"]  # fmt: skip
    run = run_group(cmd, capture_output=True, text=True, timeout=seconds + 180)
    print("\n".join(run.stdout.strip().splitlines()[-16:]))
    if run.returncode:
        print(f"bench run exited {run.returncode}: {run.stderr.strip()[-1500:]}")
        return
    timeline = pd.read_csv(run_dir / "timeline.csv")
    gpu = [c for c in timeline.columns if c.startswith("gpu")]
    if not gpu:
        print("NVML columns MISSING from timeline.csv: " + ", ".join(timeline.columns))
        return
    stats = timeline[gpu].agg(["mean", "max"]).T
    print(f"timeline.csv: {len(timeline)} samples; NVML columns:")
    print(stats.to_string(float_format=lambda v: f"{v:.1f}"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--out", default=None, help="folder for step logs and the bench run")
    ap.add_argument("--quick", action="store_true", help="fewer sizes, a 20 s bench run")
    args = ap.parse_args()
    out = Path(args.out or tempfile.mkdtemp(prefix="gpu-check-"))
    out.mkdir(parents=True, exist_ok=True)
    print(f"gpu_check: {'CUDA' if CUDA else 'NO CUDA: GPU sections skipped'}; files in {out}")
    peak: dict[str, Any] = {}
    steps: list[tuple[str, Callable[[], Any]]] = [
        ("device peak", lambda: peak.update(peak_section())),
        ("decode attention bandwidth", lambda: attention_section(peak, args.quick)),
        ("fused vs unfused add+RMSNorm and RoPE", fused_section),
        ("engine throughput", lambda: throughput_section(args.quick)),
        ("MFU and MBU per step", lambda: utilization_section(peak, out)),
        ("fp8 linear vs bf16", lambda: fp8_section(args.quick)),
        ("bench profile of a decode step", lambda: profile_section(out)),
        ("bench run, NVML timeline", lambda: bench_run_section(out, args.quick)),
    ]
    failed = []
    for title, fn in steps:
        section(title)
        t0 = time.perf_counter()
        try:
            fn()
        except Exception:
            failed.append(title)
            print(f"FAILED {title}:\n{traceback.format_exc(limit=6)}")
        print(f"({time.perf_counter() - t0:.0f} s)", flush=True)
    print(f"\ngpu_check done; failed sections: {', '.join(failed) or 'none'}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
