"""Rotary embeddings ('rotate half' layout, as engine/ops/layers.py), and Q and K rotated in
place by one kernel."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.ops.triton.cast import INTERPRET, cast


@triton.jit
def _rotate(
    out_ptr, x_ptr, cs_ptr, t, num_heads, half,
    stride_xt, stride_xh, stride_ot, stride_oh, stride_cs,
    HEADS: tl.constexpr, HALF: tl.constexpr, INTERPRET: tl.constexpr,
):  # fmt: skip
    """Token t's heads: out = x * cos + rotate_half(x) * sin, each product rounded to the
    model dtype before the sum, as the reference computes it."""
    heads = tl.arange(0, HEADS)
    dims = tl.arange(0, HALF)
    ok = (heads < num_heads)[:, None] & (dims < half)[None, :]
    src = x_ptr + t * stride_xt + heads[:, None] * stride_xh + dims[None, :]
    x1 = tl.load(src, mask=ok, other=0.0)
    dtype = x1.dtype
    x1 = x1.to(tl.float32)
    x2 = tl.load(src + half, mask=ok, other=0.0).to(tl.float32)
    cos = tl.load(cs_ptr + t * stride_cs + dims, mask=dims < half, other=0.0).to(tl.float32)
    sin = tl.load(cs_ptr + t * stride_cs + 2 * half + dims, mask=dims < half, other=0.0)
    cos, sin = cos[None, :], sin.to(tl.float32)[None, :]
    a = cast(x1 * cos, dtype, INTERPRET).to(tl.float32)
    b = cast(-x2 * sin, dtype, INTERPRET).to(tl.float32)
    c = cast(x2 * cos, dtype, INTERPRET).to(tl.float32)
    d = cast(x1 * sin, dtype, INTERPRET).to(tl.float32)
    dst = out_ptr + t * stride_ot + heads[:, None] * stride_oh + dims[None, :]
    tl.store(dst, cast(a + b, dtype, INTERPRET), mask=ok)
    tl.store(dst + half, cast(c + d, dtype, INTERPRET), mask=ok)


@triton.jit
def _rotary_kernel(
    q_out_ptr, q_ptr, k_out_ptr, k_ptr, cs_ptr, num_q_heads, num_k_heads, half,
    stride_qt, stride_qh, stride_qot, stride_qoh, stride_kt, stride_kh, stride_kot,
    stride_koh, stride_cs,
    HAS_K: tl.constexpr, Q_HEADS: tl.constexpr, K_HEADS: tl.constexpr, HALF: tl.constexpr,
    INTERPRET: tl.constexpr,
):  # fmt: skip
    t = tl.program_id(0)
    _rotate(q_out_ptr, q_ptr, cs_ptr, t, num_q_heads, half, stride_qt, stride_qh, stride_qot,
            stride_qoh, stride_cs, Q_HEADS, HALF, INTERPRET)  # fmt: skip
    if HAS_K:
        _rotate(k_out_ptr, k_ptr, cs_ptr, t, num_k_heads, half, stride_kt, stride_kh,
                stride_kot, stride_koh, stride_cs, K_HEADS, HALF, INTERPRET)  # fmt: skip


def _launch(
    q: torch.Tensor, q_out: torch.Tensor, k: torch.Tensor | None, k_out: torch.Tensor | None,
    cos_sin: torch.Tensor,
) -> None:  # fmt: skip
    tokens, q_heads, head_dim = q.shape
    assert head_dim % 2 == 0 and q.stride(-1) == 1 and cos_sin.stride(-1) == 1
    assert cos_sin.shape == (tokens, 2, head_dim) and cos_sin.stride(1) == head_dim
    kk = k if k is not None else q
    ko = k_out if k_out is not None else q_out
    assert kk.stride(-1) == 1
    if tokens == 0:
        return
    _rotary_kernel[(tokens,)](
        q_out, q, ko, kk, cos_sin, q_heads, kk.shape[1], head_dim // 2,
        q.stride(0), q.stride(1), q_out.stride(0), q_out.stride(1),
        kk.stride(0), kk.stride(1), ko.stride(0), ko.stride(1), cos_sin.stride(0),
        HAS_K=k is not None, Q_HEADS=triton.next_power_of_2(q_heads),
        K_HEADS=triton.next_power_of_2(kk.shape[1]), HALF=triton.next_power_of_2(head_dim // 2),
        INTERPRET=INTERPRET,
    )  # fmt: skip


def apply_rotary(x: torch.Tensor, cos_sin: torch.Tensor) -> torch.Tensor:
    """x: [T, heads, head_dim]; cos_sin: [T, 2, head_dim] rows already picked by position."""
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    _launch(x, out, None, None, cos_sin)
    return out


def rotary_qk(
    q: torch.Tensor, k: torch.Tensor, cos_sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Both rotated in place (views of one QKV output are fine), in one launch."""
    _launch(q, q, k, k, cos_sin)
    return q, k
