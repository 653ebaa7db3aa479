"""Rotary embeddings ('rotate half' layout, as engine/ops/layers.py), and Q and K rotated in
place by one kernel."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.ops.triton.cast import INTERPRET, cast, device_function

ROWS = 128 if INTERPRET else 16  # (token, head) rows a program: the interpreter pays per program


@device_function
def _rotate(
    out_ptr, x_ptr, cs_ptr, block, num_heads, num_rows, half,
    stride_xt, stride_xh, stride_ot, stride_oh, stride_cs,
    ROWS: tl.constexpr, HALF: tl.constexpr, INTERPRET: tl.constexpr,
):  # fmt: skip
    """ROWS (token, head) rows from row `block * ROWS` on: out = x * cos + rotate_half(x) *
    sin, each product rounded to the model dtype before the sum, as the reference does."""
    rows = block * ROWS + tl.arange(0, ROWS)
    t, head = rows // num_heads, rows % num_heads
    dims = tl.arange(0, HALF)
    ok = (rows < num_rows)[:, None] & (dims < half)[None, :]
    src = x_ptr + (t * stride_xt + head * stride_xh)[:, None] + dims[None, :]
    x1 = tl.load(src, mask=ok, other=0.0)
    dtype = x1.dtype
    x1 = x1.to(tl.float32)
    x2 = tl.load(src + half, mask=ok, other=0.0).to(tl.float32)
    table = cs_ptr + (t * stride_cs)[:, None] + dims[None, :]
    cos = tl.load(table, mask=ok, other=0.0).to(tl.float32)
    sin = tl.load(table + 2 * half, mask=ok, other=0.0).to(tl.float32)
    a = cast(x1 * cos, dtype, INTERPRET).to(tl.float32)
    b = cast(-x2 * sin, dtype, INTERPRET).to(tl.float32)
    c = cast(x2 * cos, dtype, INTERPRET).to(tl.float32)
    d = cast(x1 * sin, dtype, INTERPRET).to(tl.float32)
    dst = out_ptr + (t * stride_ot + head * stride_oh)[:, None] + dims[None, :]
    tl.store(dst, cast(a + b, dtype, INTERPRET), mask=ok)
    tl.store(dst + half, cast(c + d, dtype, INTERPRET), mask=ok)


@triton.jit
def _rotary_kernel(
    q_out_ptr, q_ptr, k_out_ptr, k_ptr, cs_ptr, tokens, num_q_heads, num_k_heads, half,
    q_programs, stride_qt, stride_qh, stride_qot, stride_qoh, stride_kt, stride_kh,
    stride_kot, stride_koh, stride_cs,
    ROWS: tl.constexpr, HALF: tl.constexpr, INTERPRET: tl.constexpr,
):  # fmt: skip
    """The first q_programs programs rotate Q's rows, the others K's."""
    pid = tl.program_id(0)
    if pid < q_programs:
        _rotate(q_out_ptr, q_ptr, cs_ptr, pid, num_q_heads, tokens * num_q_heads, half,
                stride_qt, stride_qh, stride_qot, stride_qoh, stride_cs, ROWS, HALF,
                INTERPRET)  # fmt: skip
    else:
        _rotate(k_out_ptr, k_ptr, cs_ptr, pid - q_programs, num_k_heads, tokens * num_k_heads,
                half, stride_kt, stride_kh, stride_kot, stride_koh, stride_cs, ROWS, HALF,
                INTERPRET)  # fmt: skip


def _launch(
    q: torch.Tensor, q_out: torch.Tensor, k: torch.Tensor | None, k_out: torch.Tensor | None,
    cos_sin: torch.Tensor,
) -> None:  # fmt: skip
    tokens, q_heads, head_dim = q.shape
    assert head_dim % 2 == 0 and q.stride(-1) == 1 and cos_sin.stride(-1) == 1
    assert cos_sin.shape == (tokens, 2, head_dim) and cos_sin.stride(1) == head_dim
    if tokens == 0:
        return
    q_programs = triton.cdiv(tokens * q_heads, ROWS)
    k_programs = 0 if k is None else triton.cdiv(tokens * k.shape[1], ROWS)
    kk, ko = (k, k_out) if k is not None and k_out is not None else (q, q_out)
    assert kk.stride(-1) == 1
    _rotary_kernel[(q_programs + k_programs,)](
        q_out, q, ko, kk, cos_sin, tokens, q_heads, kk.shape[1], head_dim // 2, q_programs,
        q.stride(0), q.stride(1), q_out.stride(0), q_out.stride(1),
        kk.stride(0), kk.stride(1), ko.stride(0), ko.stride(1), cos_sin.stride(0),
        ROWS=ROWS, HALF=triton.next_power_of_2(head_dim // 2), INTERPRET=INTERPRET,
        enable_fp_fusion=False,  # each product rounded before the sum, as the reference
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
