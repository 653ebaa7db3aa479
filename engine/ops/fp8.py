"""FP8 (e4m3) quantize, dequantize and matmul.

Weights: one float32 scale per output channel, so a channel's largest weight maps to 448,
e4m3's largest value. Activations (CUDA only): one scale per token, computed on the fly.
KV cache: one scale per layer and KV head, fixed at start-up (see engine/model/kv_scales.py)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

FP8 = torch.float8_e4m3fn
FP8_MAX = torch.finfo(FP8).max  # 448
_MIN_SCALE = 1e-12  # an all-zero channel still gets a finite scale


def quantize(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """x / scale rounded to e4m3; clamped first, as a cast of a value over 448 gives NaN."""
    return (x.float() / scale).clamp_(-FP8_MAX, FP8_MAX).to(FP8)


def quantize_per_channel(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[out, in] weight -> (fp8 weight, float32 scale [out])."""
    scale = w.float().abs().amax(dim=1).clamp_(min=_MIN_SCALE) / FP8_MAX
    return quantize(w, scale[:, None]), scale


def quantize_per_token(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[M, K] activations -> (fp8 activations, float32 scale [M, 1])."""
    scale = x.float().abs().amax(dim=1, keepdim=True).clamp_(min=_MIN_SCALE) / FP8_MAX
    return quantize(x, scale), scale


# e4m3 -> float16 by moving bits: e4m3's 7 exponent+mantissa bits, shifted left by 7, are a
# float16 whose exponent bias is 8 too small, so the value is 2**-8 of the fp8 one; subnormals
# come out right too. Exact for all 254 finite codes (tested), and much faster on CPU than
# torch's own fp8 -> float cast (docs/results/2026-12-04-cpu-design-choices.md).
FP16_FROM_FP8_FACTOR = 256.0
_SIGN_AND_LOW_BITS = -16512  # int16 0xBF80: keep the sign (bit 15) and bits 13..7


def upcast(q: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, float]:
    """fp8 tensor -> (tensor in `dtype`, factor): the fp8 values are `tensor * factor`.

    On CPU the bit trick above (factor 256), elsewhere a plain cast (factor 1); callers fold the
    factor into their scales, which costs nothing."""
    if q.device.type != "cpu":
        return q.to(dtype), 1.0
    bits = q.view(torch.int8).to(torch.int16)  # sign-extends: bit 15 is the sign
    bits.bitwise_left_shift_(7).bitwise_and_(_SIGN_AND_LOW_BITS)
    return bits.view(torch.float16).to(dtype), FP16_FROM_FP8_FACTOR


def dequantize(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    values, factor = upcast(q, dtype)
    return values * (scale * factor).to(dtype)


def use_scaled_mm(device: torch.device) -> bool:
    """W8A8 through `torch._scaled_mm` where the tensor cores take fp8 (CUDA, sm89+). On CPU,
    upcast-then-matmul is faster (benchmarks/fp8_matmul.py measures both)."""
    if device.type != "cuda":
        return False
    return torch.cuda.get_device_capability(device) >= (8, 9)


def fp8_linear(
    x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor, scaled_mm: bool
) -> torch.Tensor:
    """y = x @ (weight * scale).T in x's dtype. weight: fp8 [out, in]; weight_scale: [out]."""
    if scaled_mm:
        shape = x.shape
        qx, x_scale = quantize_per_token(x.reshape(-1, shape[-1]))
        y = torch._scaled_mm(
            qx,
            weight.t(),  # column-major, as _scaled_mm wants its second operand
            scale_a=x_scale,
            scale_b=weight_scale.view(1, -1),
            out_dtype=x.dtype,
        )
        return y.view(*shape[:-1], -1)
    if weight.device.type == "cpu":
        return _blocked_weight_only(x, weight, weight_scale)
    # Weight-only elsewhere (GPUs without fp8 tensor cores): upcast, matmul, scale columns.
    return F.linear(x, weight.to(x.dtype)) * weight_scale.to(x.dtype)


# Rows of weight upcast at a time on CPU: ~1M elements (4 MB in float32), the fastest block
# measured. Upcasting a whole 7B-sized weight at once made hundreds of MB of fresh temporaries
# a call, each page-faulted in; blocked, the buffers are reused while still in cache.
_CPU_BLOCK_ELEMENTS = 2**20


def _blocked_weight_only(
    x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor
) -> torch.Tensor:
    """x @ upcast(weight).T * scale, a block of weight rows at a time, into the transposed
    output (each block's rows of it are contiguous)."""
    n, k = weight.shape
    x2 = x.reshape(-1, k)
    rows = max(1, min(n, _CPU_BLOCK_ELEMENTS // k))
    out_t = torch.empty(n, x2.shape[0], dtype=x.dtype)
    bits = torch.empty(rows, k, dtype=torch.int16)
    w = torch.empty(rows, k, dtype=x.dtype)
    q = weight.view(torch.int8)
    for r0 in range(0, n, rows):
        r1 = min(n, r0 + rows)
        b, wb = bits[: r1 - r0], w[: r1 - r0]
        b.copy_(q[r0:r1])  # sign-extends, as in upcast()
        b.bitwise_left_shift_(7).bitwise_and_(_SIGN_AND_LOW_BITS)
        wb.copy_(b.view(torch.float16))
        torch.mm(wb, x2.t(), out=out_t[r0:r1])
    out_t *= (weight_scale * FP16_FROM_FP8_FACTOR).to(x.dtype)[:, None]
    return out_t.t().contiguous().view(*x.shape[:-1], n)


class Fp8Linear(nn.Module):
    """A bias-free nn.Linear whose weight is stored in e4m3 with per-output-channel scales."""

    def __init__(self, weight: torch.Tensor, weight_scale: torch.Tensor, scaled_mm: bool) -> None:
        super().__init__()
        self.register_buffer("weight", weight)
        self.register_buffer("weight_scale", weight_scale)
        self.scaled_mm = scaled_mm

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> Fp8Linear:
        if linear.bias is not None:
            raise ValueError("fp8 quantization covers bias-free linears only")
        weight, scale = quantize_per_channel(linear.weight.data)
        return cls(weight, scale, use_scaled_mm(weight.device))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # _scaled_mm's per-row scales take bf16 output only: a float32 model goes weight-only.
        scaled_mm = self.scaled_mm and x.dtype == torch.bfloat16
        return fp8_linear(x, self.weight, self.weight_scale, scaled_mm)

    def extra_repr(self) -> str:
        out_features, in_features = self.weight.shape
        return f"in_features={in_features}, out_features={out_features}, fp8_e4m3"
