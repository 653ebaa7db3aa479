"""The CPU linear paths side by side: the engine's kernel (`servebench::linear`,
engine/ops/cpu_kernels.cpp), oneDNN's packed product and MKL (`F.linear`) on float32 weights,
on e4m3 weights (`--quantization fp8`) the kernel's `linear_fp8` and the eager path it
replaced (engine/ops/fp8.py: upcast a block of rows, then MKL), and where the CPU has
AVX512-BF16 on bf16 weights the kernel's `linear_bf16` and torch's bf16 product (oneDNN),
over the linears of a model's layers so that the weights stream from memory as in a step
(not from cache), at each row count; paths take turns, and each row's ratios are to the
float32 kernel.

    python benchmarks/cpu_linear.py                      # SmolLM2-135M's shapes, 30 layers
    python benchmarks/cpu_linear.py --rows 1 8 64 --layers 10 --passes 5

Also prints a sum over the same weights (what reading them costs) for the memory-bound rows."""

from __future__ import annotations

import argparse
import time

# isort: off
import engine  # noqa: F401 (first: it tunes glibc's allocator before torch allocates)

# isort: on
import torch
import torch.nn.functional as F

from engine.ops import cpu_kernels
from engine.ops.cpu_linear import bf16_blocks, fp8_blocks, packed_product, to_blocks
from engine.ops.fp8 import fp8_linear, quantize_per_channel

SMOLLM2 = [(960, 576), (576, 576), (3072, 576), (576, 1536)]  # QKV, O, gate/up, down


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32, 64, 256, 1024])
    p.add_argument("--layers", type=int, default=30)
    p.add_argument("--passes", type=int, default=4, help="per path and row count (min is kept)")
    args = p.parse_args()
    if not cpu_kernels.available():
        raise SystemExit("the kernel could not be built here (see the warning)")
    gen = torch.Generator().manual_seed(0)
    plain = [
        [torch.randn(o, i, generator=gen) * 0.02 for o, i in SMOLLM2] for _ in range(args.layers)
    ]
    blocks = [[to_blocks(w) for w in ws] for ws in plain]
    onednn = [[torch.ops.mkldnn._reorder_linear_weight(w) for w in ws] for ws in plain]
    fp8 = [[quantize_per_channel(w) for w in ws] for ws in plain]
    fp8_packed = [[fp8_blocks(q, scale) for q, scale in ws] for ws in fp8]
    nbytes = sum(w.numel() * 4 for ws in plain for w in ws)
    threads = torch.get_num_threads()
    print(f"{args.layers} layers of {SMOLLM2} (out, in), {nbytes / 2**20:.0f} MiB, "
          f"{threads} threads; ms for all layers, min of {args.passes}")  # fmt: skip
    paths = {
        "kernel": lambda x, n, j: torch.ops.servebench.linear(x, blocks[n][j], SMOLLM2[j][0]),
        "oneDNN": lambda x, n, j: packed_product(x, onednn[n][j]),
        "MKL": lambda x, n, j: F.linear(x, plain[n][j]),
        "fp8 kernel": lambda x, n, j: torch.ops.servebench.linear_fp8(
            x, *fp8_packed[n][j], SMOLLM2[j][0]
        ),
        "fp8 eager": lambda x, n, j: fp8_linear(x, *fp8[n][j], scaled_mm=False),
    }
    if cpu_kernels.bf16_available():  # bf16 x and weights: the engine's kernel, torch's
        bf16 = [[w.bfloat16() for w in ws] for ws in plain]
        bf16_packed = [[bf16_blocks(w) for w in ws] for ws in bf16]
        paths["bf16 kernel"] = lambda x, n, j: torch.ops.servebench.linear_bf16(
            x, bf16_packed[n][j], SMOLLM2[j][0]
        )
        paths["bf16 torch"] = lambda x, n, j: F.linear(x, bf16[n][j])
    ratios = "  ".join(f"{n}/kernel" for n in list(paths)[1:])
    print(f"{'rows':>5} " + " ".join(f"{n + ' ms':>13}" for n in paths)
          + f"  kernel GB/s  GFLOP/s  {ratios}")  # fmt: skip
    with torch.inference_mode():
        for rows in args.rows:
            xs = {i: torch.randn(rows, i, generator=gen) for _, i in SMOLLM2}
            x16 = {i: x.bfloat16() for i, x in xs.items()}
            want = F.linear(xs[576], plain[0][0])
            torch.testing.assert_close(paths["kernel"](xs[576], 0, 0), want, rtol=1e-4, atol=1e-4)
            best = {n: float("inf") for n in paths}
            for _ in range(args.passes):
                for name, f in paths.items():
                    t0 = time.perf_counter()
                    inputs = x16 if name.startswith("bf16") else xs
                    for layer in range(args.layers):
                        for j, (_, i) in enumerate(SMOLLM2):
                            f(inputs[i], layer, j)
                    best[name] = min(best[name], time.perf_counter() - t0)
            k = best["kernel"]
            flops = 2 * rows * nbytes / 4
            cells = " ".join(f"{best[n] * 1e3:13.2f}" for n in paths)
            ratios = "  ".join(f"{best[n] / k:{len(n) + 7}.2f}x" for n in list(paths)[1:])
            print(f"{rows:5d} {cells}  {nbytes / k / 1e9:11.1f}  {flops / k / 1e9:7.0f}  {ratios}",
                  flush=True)  # fmt: skip
        t = float("inf")
        for _ in range(args.passes):
            t0 = time.perf_counter()
            for ws in plain:
                for w in ws:
                    w.sum()
            t = min(t, time.perf_counter() - t0)
        print(f"a sum over the same weights: {t * 1e3:.2f} ms ({nbytes / t / 1e9:.1f} GB/s)")


if __name__ == "__main__":
    main()
