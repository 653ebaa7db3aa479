"""Our FP8 linear vs the model-dtype linear on the layer shapes of SmolLM2-135M, Llama-7B and
Llama-70B, on whatever device is present; prints times and ratios measured side by side.

    python benchmarks/fp8_matmul.py [--models smollm2,7b,70b] [--tokens 1,32,256] [--threads 2]

Paths timed for each shape and token count M:
  ref      F.linear in the reference dtype (bfloat16; float32 on CPUs without native bf16)
  fp8-wo   the engine's CPU path: weight-only fp8, upcast then matmul (engine/ops/fp8.py)
  fp8-mm   W8A8 through torch._scaled_mm with per-token activation scales (the CUDA path)
A ratio > 1 means the fp8 path is faster than ref."""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F

from engine.ops.fp8 import fp8_linear, quantize_per_channel
from engine.resolve import resolve_device, resolve_dtype

# (name, out_features, in_features) of one decoder layer's linears, q/k/v and gate/up fused.
SHAPES = {
    "smollm2": [("qkv", 960, 576), ("o", 576, 576), ("gate_up", 3072, 576), ("down", 576, 1536)],
    "7b": [
        ("qkv", 12288, 4096),
        ("o", 4096, 4096),
        ("gate_up", 22016, 4096),
        ("down", 4096, 11008),
    ],
    "70b": [
        ("qkv", 10240, 8192),
        ("o", 8192, 8192),
        ("gate_up", 57344, 8192),
        ("down", 8192, 28672),
    ],
}


def timeit(fn, device: torch.device, min_s: float = 0.2) -> float:
    """Median seconds per call over enough calls to fill `min_s`."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    fn()
    sync()
    times: list[float] = []
    start = time.perf_counter()
    while time.perf_counter() - start < min_s or len(times) < 3:
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]


def time_layer(
    n: int, k: int, tokens: list[int], device: torch.device, dtype: torch.dtype, scaled_mm: bool
) -> list[tuple[float, float, float]]:
    """(ref, fp8-wo, fp8-mm) seconds for one [n, k] weight at each token count."""
    g = torch.Generator(device=device).manual_seed(0)
    w = torch.randn(n, k, generator=g, device=device, dtype=dtype) * k**-0.5
    qw, scale = quantize_per_channel(w)
    out = []
    for m in tokens:
        x = torch.randn(m, k, generator=g, device=device, dtype=dtype)
        ref = timeit(lambda: F.linear(x, w), device)  # noqa: B023 (called before x changes)
        wo = timeit(lambda: fp8_linear(x, qw, scale, scaled_mm=False), device)  # noqa: B023
        mm = float("nan")
        if scaled_mm:
            mm = timeit(lambda: fp8_linear(x, qw, scale, scaled_mm=True), device)  # noqa: B023
        out.append((ref, wo, mm))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--models", default="smollm2,7b,70b")
    ap.add_argument("--tokens", default="1,32,256")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--device", default="auto")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    device = resolve_device(args.device)
    dtype = getattr(torch, resolve_dtype("auto", device))
    can_scaled_mm = device.type == "cpu" or torch.cuda.get_device_capability(device) >= (8, 9)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    print(
        f"device {device} ({name}), reference dtype {dtype}, torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads"
    )
    print(
        f"{'model':<8}{'layer':<9}{'shape':>14}{'M':>6}{'ref ms':>10}{'fp8-wo ms':>11}"
        f"{'fp8-mm ms':>11}{'ref/wo':>8}{'ref/mm':>8}"
    )
    tokens = [int(t) for t in args.tokens.split(",")]
    totals: dict[tuple[str, int], list[float]] = {}
    for model in args.models.split(","):
        for layer, n, k in SHAPES[model]:
            timed = time_layer(n, k, tokens, device, dtype, can_scaled_mm)
            for m, times in zip(tokens, timed, strict=True):
                ref, wo, mm = times
                t = totals.setdefault((model, m), [0.0, 0.0, 0.0])
                for i, v in enumerate(times):
                    t[i] += v
                print(
                    f"{model:<8}{layer:<9}{f'{n}x{k}':>14}{m:>6}{ref * 1e3:>10.3f}"
                    f"{wo * 1e3:>11.3f}{mm * 1e3:>11.3f}{ref / wo:>8.2f}{ref / mm:>8.2f}",
                    flush=True,
                )
    print("\nwhole layer (sum of its four linears):")
    for (model, m), (ref, wo, mm) in totals.items():
        print(
            f"{model:<8}M={m:<5} ref {ref * 1e3:9.3f} ms  fp8-wo {wo * 1e3:9.3f} ms "
            f"({ref / wo:.2f}x)  fp8-mm {mm * 1e3:9.3f} ms ({ref / mm:.2f}x)"
        )


if __name__ == "__main__":
    main()
