"""The KV-cache write (vLLM's reshape_and_cache): each new token's K and V to its slot in the
head-major paged cache, quantized to e4m3 with the layer's per-head scales in the same pass."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.ops.attention import KVCache
from engine.ops.fp8 import FP8_MAX
from engine.ops.triton.cast import INTERPRET, cast, device_function

ROWS = 128 if INTERPRET else 8  # (token, head) rows a program: the interpreter pays per program


@device_function
def _store(
    cache_ptr, src_ptr, scale_ptr, tokens, slots, rows, head, head_dim,
    stride_t, stride_h, stride_ch, stride_cb, stride_cs,
    BLOCK_SIZE: tl.constexpr, DIM: tl.constexpr, FP8: tl.constexpr,
    FP8_MAX: tl.constexpr, INTERPRET: tl.constexpr,
):  # fmt: skip
    dims = tl.arange(0, DIM)
    ok = (rows >= 0)[:, None] & (dims < head_dim)[None, :]
    x = tl.load(src_ptr + (tokens * stride_t + head * stride_h)[:, None] + dims[None, :],
                mask=ok)  # fmt: skip
    x = x.to(tl.float32)
    if FP8:  # as engine/ops/fp8.py's quantize: divide, clamp, round
        scale = tl.load(scale_ptr + head, mask=rows >= 0, other=1.0)
        # div_rn: correctly rounded, as torch divides (a GPU's default division is not)
        x = tl.clamp(tl.math.div_rn(x, scale[:, None]), -FP8_MAX, FP8_MAX)
    block, offset = slots // BLOCK_SIZE, slots % BLOCK_SIZE
    dst = cache_ptr + head.to(tl.int64) * stride_ch + block.to(tl.int64) * stride_cb
    dst += offset * stride_cs
    tl.store(dst[:, None] + dims[None, :], cast(x, cache_ptr.dtype.element_ty, INTERPRET),
             mask=ok)  # fmt: skip


@triton.jit
def _write_kernel(
    k_cache_ptr, v_cache_ptr, k_ptr, v_ptr, k_scale_ptr, v_scale_ptr, slots_ptr,
    num_rows, num_heads, head_dim, stride_kt, stride_kh, stride_vt, stride_vh,
    stride_ch, stride_cb, stride_cs,
    ROWS: tl.constexpr, BLOCK_SIZE: tl.constexpr, DIM: tl.constexpr, FP8: tl.constexpr,
    FP8_MAX: tl.constexpr, INTERPRET: tl.constexpr,
):  # fmt: skip
    """ROWS (token, KV head) rows; a negative slot is a padding token: nothing to keep."""
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    tokens, head = rows // num_heads, rows % num_heads
    slots = tl.load(slots_ptr + tokens, mask=rows < num_rows, other=-1)
    rows = tl.where(slots >= 0, rows, -1)
    _store(k_cache_ptr, k_ptr, k_scale_ptr, tokens, slots, rows, head, head_dim, stride_kt,
           stride_kh, stride_ch, stride_cb, stride_cs, BLOCK_SIZE, DIM, FP8, FP8_MAX,
           INTERPRET)  # fmt: skip
    _store(v_cache_ptr, v_ptr, v_scale_ptr, tokens, slots, rows, head, head_dim, stride_vt,
           stride_vh, stride_ch, stride_cb, stride_cs, BLOCK_SIZE, DIM, FP8, FP8_MAX,
           INTERPRET)  # fmt: skip


def write_kv_cache(
    k: torch.Tensor,  # [T, kv_heads, head_dim]
    v: torch.Tensor,
    cache: KVCache,
    slot_mapping: torch.Tensor,  # [T]
) -> None:
    tokens, heads, head_dim = k.shape
    assert k.stride(-1) == 1 and v.stride(-1) == 1 and cache.k.is_contiguous()
    assert cache.k.stride() == cache.v.stride()
    if tokens == 0:
        return
    fp8 = cache.k_scale is not None
    _write_kernel[(triton.cdiv(tokens * heads, ROWS),)](
        cache.k, cache.v, k, v, cache.k_scale if fp8 else k, cache.v_scale if fp8 else v,
        slot_mapping, tokens * heads, heads, head_dim, k.stride(0), k.stride(1), v.stride(0),
        v.stride(1), cache.k.stride(0), cache.k.stride(1), cache.k.stride(2),
        ROWS=ROWS, BLOCK_SIZE=cache.k.shape[2], DIM=triton.next_power_of_2(head_dim), FP8=fp8,
        FP8_MAX=FP8_MAX, INTERPRET=INTERPRET,
    )  # fmt: skip
