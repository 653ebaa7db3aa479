"""RMSNorm, alone and fused with the residual add before it: one pass over each row instead
of an add, a square-mean and a scale each reading and writing the whole activation."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.ops.triton.cast import INTERPRET, cast

ROWS = 64 if INTERPRET else 1  # rows a program: the interpreter pays per program, a GPU per row


@triton.jit
def _rms_norm_kernel(
    out_ptr, sum_ptr, x_ptr, residual_ptr, weight_ptr, eps, num_rows, hidden,
    stride_x, stride_r, stride_out, stride_sum,
    HAS_RESIDUAL: tl.constexpr, ROWS: tl.constexpr, BLOCK: tl.constexpr,
    INTERPRET: tl.constexpr,
):  # fmt: skip
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK)
    ok = (rows < num_rows)[:, None] & (cols < hidden)[None, :]
    x = tl.load(x_ptr + rows[:, None] * stride_x + cols[None, :], mask=ok, other=0.0)
    dtype = x.dtype
    x = x.to(tl.float32)
    if HAS_RESIDUAL:
        r = tl.load(residual_ptr + rows[:, None] * stride_r + cols[None, :], mask=ok, other=0.0)
        # The sum rounded to the model dtype, as torch's add leaves it, is both the new
        # residual and what is normalised.
        h = cast(x + r.to(tl.float32), dtype, INTERPRET)
        tl.store(sum_ptr + rows[:, None] * stride_sum + cols[None, :], h, mask=ok)
        x = h.to(tl.float32)
    # Correctly rounded sqrt and divisions, as torch's rsqrt on CPU (a GPU's defaults are not)
    mean = tl.math.div_rn(tl.sum(x * x, axis=1), hidden.to(tl.float32))
    inv = tl.math.div_rn(1.0, tl.sqrt_rn(mean + eps))
    normed = cast(x * inv[:, None], dtype, INTERPRET).to(tl.float32)
    w = tl.load(weight_ptr + cols, mask=cols < hidden, other=0.0).to(tl.float32)
    y = cast(w[None, :] * normed, dtype, INTERPRET)
    tl.store(out_ptr + rows[:, None] * stride_out + cols[None, :], y, mask=ok)


def _launch(
    x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor | None]:
    hidden = x.shape[-1]
    x2 = x.reshape(-1, hidden)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    out = torch.empty(x2.shape, dtype=x.dtype, device=x.device)
    # Without a residual the kernel reads and writes neither: x and out stand in for them.
    r2 = x2 if residual is None else residual.reshape(-1, hidden).contiguous()
    total = out if residual is None else torch.empty_like(out)
    _rms_norm_kernel[(triton.cdiv(x2.shape[0], ROWS),)](
        out, total, x2, r2, weight, eps, x2.shape[0], hidden, x2.stride(0), r2.stride(0),
        out.stride(0), total.stride(0), HAS_RESIDUAL=residual is not None, ROWS=ROWS,
        BLOCK=triton.next_power_of_2(hidden), INTERPRET=INTERPRET,
        enable_fp_fusion=False,  # the reference's roundings, no fused multiply-adds
    )  # fmt: skip
    shape = x.shape
    return out.view(shape), None if residual is None else total.view(shape)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return _launch(x, None, weight, eps)[0]


def add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(rms_norm(x + residual), x + residual) in one kernel."""
    out, total = _launch(x, residual, weight, eps)
    assert total is not None
    return out, total
