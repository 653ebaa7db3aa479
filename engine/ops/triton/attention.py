"""Unified paged attention: decode queries and prefill chunks of a step in one launch.

One program takes BLOCK_Q query tokens of one sequence and all GROUP query heads that share
one KV head (BLOCK_M = BLOCK_Q * GROUP rows, padded to a power of two), walks that sequence's
keys TILE at a time through its block table, and keeps an online softmax in float32, so each
K/V tile is read once for the whole group. The causal rule is on absolute positions: the
chunk's queries sit at the end of the sequence (after `seq_len - query_len` cached tokens),
so a decode, a first chunk and a chunk continuing mid-block are all the same case. The design
follows vLLM's triton_unified_attention (2D variant)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.ops.attention import AttentionMetadata, KVCache
from engine.ops.triton.cast import INTERPRET, cast, device_function, dot_dtype, dot_precision

# Launch sizes. A GPU: vLLM's (16 query rows a program, 32 keys a tile). The interpreter pays
# per operation, not per element: bigger blocks. Tests can set the GPU's to run them on CPU.
MIN_BLOCK_M = 32 if INTERPRET else 16  # tl.dot wants >= 16 rows
TILE = 64 if INTERPRET else 32


@device_function
def _find_sequence(query_start_ptr, num_seqs, q_block, BLOCK_Q: tl.constexpr):
    """The sequence that owns global query block `q_block`. Sequence i's blocks are numbered
    from query_start[i] // BLOCK_Q + i on (an upper bound of the blocks before it, so no
    prefix sum over block counts is needed): the last i whose first block is <= q_block."""
    lo = 0
    hi = num_seqs
    while lo < hi:
        mid = (lo + hi) // 2
        if tl.load(query_start_ptr + mid) // BLOCK_Q + mid <= q_block:
            lo = mid + 1
        else:
            hi = mid
    return lo - 1


@triton.jit
def _attention_kernel(
    out_ptr, q_ptr, k_cache_ptr, v_cache_ptr, k_scale_ptr, v_scale_ptr,
    block_tables_ptr, seq_lens_ptr, query_start_ptr, part_acc_ptr, part_m_ptr, part_total_ptr,
    scale, num_seqs, num_heads, head_dim,
    stride_qt, stride_qh, stride_ot, stride_oh, stride_ch, stride_cb, stride_cs, stride_bt,
    GROUP: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, TILE: tl.constexpr, DIM: tl.constexpr, FP8: tl.constexpr,
    SEGMENTS: tl.constexpr, DOT_DTYPE: tl.constexpr, PRECISION: tl.constexpr,
    INTERPRET: tl.constexpr,
):  # fmt: skip
    """With SEGMENTS > 1 (decode steps of few sequences on a GPU) program (., ., s) takes the
    s-th of SEGMENTS slices of the keys and leaves its unnormalised partial sums for
    _merge_segments: more programs than sequences x KV heads, so that long contexts at small
    batch use the whole GPU (vLLM's 3D variant)."""
    q_block = tl.program_id(0)
    kv_head = tl.program_id(1)
    seq = _find_sequence(query_start_ptr, num_seqs, q_block, BLOCK_Q)
    q_start = tl.load(query_start_ptr + seq)
    q_len = tl.load(query_start_ptr + seq + 1) - q_start
    local = q_block - (q_start // BLOCK_Q + seq)
    if local * BLOCK_Q < q_len:  # else a spare program of the upper-bound numbering
        seq_len = tl.load(seq_lens_ptr + seq)
        context = seq_len - q_len  # tokens cached before this step's chunk

        rows = tl.arange(0, BLOCK_M)
        q_idx = local * BLOCK_Q + rows // GROUP  # query token within the chunk
        head = kv_head * GROUP + rows % GROUP
        row_ok = (rows < BLOCK_Q * GROUP) & (q_idx < q_len)
        dims = tl.arange(0, DIM)
        dim_ok = dims < head_dim
        q_rows = (q_start + q_idx) * stride_qt + head * stride_qh
        q = tl.load(q_ptr + q_rows[:, None] + dims[None, :],
                    mask=row_ok[:, None] & dim_ok[None, :], other=0.0)  # fmt: skip
        out_dtype = q.dtype
        q = q.to(DOT_DTYPE)
        q_pos = context + q_idx  # absolute position: keys up to it are visible

        k_scale = 1.0
        v_scale = 1.0
        if FP8:
            k_scale = tl.load(k_scale_ptr + kv_head)
            v_scale = tl.load(v_scale_ptr + kv_head)
        m = tl.full([BLOCK_M], float("-inf"), tl.float32)
        total = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, DIM], tl.float32)
        keys = tl.arange(0, TILE)
        num_keys = tl.minimum(seq_len, context + (local + 1) * BLOCK_Q)  # the last row's view
        per_segment = tl.cdiv(tl.cdiv(num_keys, TILE), SEGMENTS) * TILE
        first = tl.program_id(2) * per_segment
        for start in range(first, tl.minimum(num_keys, first + per_segment), TILE):
            key = start + keys
            key_ok = key < num_keys
            block = tl.load(block_tables_ptr + seq * stride_bt + key // BLOCK_SIZE,
                            mask=key_ok, other=0)  # fmt: skip
            # int64: the head term alone passes 2**31 in caches of a few tens of GB
            slot = kv_head.to(tl.int64) * stride_ch + block.to(tl.int64) * stride_cb
            slot += (key % BLOCK_SIZE) * stride_cs
            k = tl.load(
                k_cache_ptr + slot[None, :] + dims[:, None],
                mask=dim_ok[:, None] & key_ok[None, :],
                other=0.0,
            )  # [DIM, TILE]
            v = tl.load(
                v_cache_ptr + slot[:, None] + dims[None, :],
                mask=key_ok[:, None] & dim_ok[None, :],
                other=0.0,
            )  # [TILE, DIM]
            if FP8:
                k = k.to(tl.float32) * k_scale
                v = v.to(tl.float32) * v_scale
            s = tl.dot(q, k.to(DOT_DTYPE), input_precision=PRECISION) * scale
            visible = row_ok[:, None] & (key[None, :] <= q_pos[:, None])
            s = tl.where(visible, s, float("-inf"))
            m_new = tl.maximum(m, tl.max(s, axis=1))
            m_new = tl.where(m_new > float("-inf"), m_new, 0.0)  # a row with nothing visible yet
            p = tl.exp(s - m_new[:, None])
            alpha = tl.exp(m - m_new)
            total = total * alpha + tl.sum(p, axis=1)
            acc = tl.dot(p.to(DOT_DTYPE), v.to(DOT_DTYPE), acc * alpha[:, None],
                         input_precision=PRECISION)  # fmt: skip
            m = m_new
        if SEGMENTS == 1:
            acc = acc / tl.where(total > 0.0, total, 1.0)[:, None]
            o_rows = (q_start + q_idx) * stride_ot + head * stride_oh
            tl.store(out_ptr + o_rows[:, None] + dims[None, :], cast(acc, out_dtype, INTERPRET),
                     mask=row_ok[:, None] & dim_ok[None, :])  # fmt: skip
        else:  # partials [tokens, heads, SEGMENTS] (x DIM), float32
            part = ((q_start + q_idx) * num_heads + head) * SEGMENTS + tl.program_id(2)
            # -inf where nothing was visible: a slice of keys all after a prefill query
            tl.store(part_m_ptr + part, tl.where(total > 0.0, m, float("-inf")), mask=row_ok)
            tl.store(part_total_ptr + part, total, mask=row_ok)
            tl.store(part_acc_ptr + part.to(tl.int64)[:, None] * DIM + dims[None, :], acc,
                     mask=row_ok[:, None])  # fmt: skip


@triton.jit
def _merge_segments(
    out_ptr, part_acc_ptr, part_m_ptr, part_total_ptr, num_heads, head_dim, stride_ot,
    stride_oh, SEGMENTS: tl.constexpr, DIM: tl.constexpr, INTERPRET: tl.constexpr,
):  # fmt: skip
    """One (token, head): the segments' softmax sums rescaled to their common maximum."""
    t = tl.program_id(0)
    head = tl.program_id(1)
    part = (t * num_heads + head) * SEGMENTS + tl.arange(0, SEGMENTS)
    dims = tl.arange(0, DIM)
    m = tl.load(part_m_ptr + part)
    top = tl.max(m, axis=0)
    weight = tl.where(m > float("-inf"), tl.exp(m - top), 0.0)  # a segment past the keys: 0
    total = tl.sum(tl.load(part_total_ptr + part) * weight, axis=0)
    acc = tl.load(part_acc_ptr + part.to(tl.int64)[:, None] * DIM + dims[None, :])
    o = tl.sum(acc * weight[:, None], axis=0) / total
    dst = out_ptr + t * stride_ot + head * stride_oh + dims
    tl.store(dst, cast(o, out_ptr.dtype.element_ty, INTERPRET), mask=dims < head_dim)


def _segments(tokens: int, num_seqs: int, kv_heads: int, device: torch.device) -> int:
    """16 key slices for a decode step whose sequences x KV heads would leave a GPU's
    multiprocessors idle (two programs per SM at least), else 1."""
    if device.type != "cuda" or tokens != num_seqs:  # some sequence has a prefill chunk
        return 1
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    return 16 if num_seqs * kv_heads < 2 * sms else 1


def paged_attention(
    q: torch.Tensor,  # [T, heads, head_dim]
    cache: KVCache,
    meta: AttentionMetadata,
    scale: float,
    tile: int | None = None,
    segments: int | None = None,
) -> torch.Tensor:
    """tile: keys per inner step (a power of two >= 16; default TILE); it need not match the
    cache's block size. segments: slices of the keys taken by programs of their own, merged
    after (a power of two; default from _segments)."""
    tokens, num_heads, head_dim = q.shape
    kv_heads, _, block_size, _ = cache.k.shape
    assert q.stride(-1) == 1 and cache.k.is_contiguous() and cache.k.stride() == cache.v.stride()
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    num_seqs = meta.seq_lens.shape[0]
    if tokens == 0:
        return out
    tile = tile or TILE
    assert tile >= 16 and tile & (tile - 1) == 0, "tile: a power of two >= 16 (tl.dot)"
    group = num_heads // kv_heads
    block_m = max(MIN_BLOCK_M, triton.next_power_of_2(group))
    block_q = block_m // group
    fp8 = cache.k_scale is not None
    segments = segments or _segments(tokens, num_seqs, kv_heads, q.device)
    assert segments & (segments - 1) == 0, "segments: a power of two"
    dim = max(16, triton.next_power_of_2(head_dim))
    parts = [out, out, out]  # unused with one segment
    if segments > 1:
        shape = (tokens, num_heads, segments)
        parts = [torch.empty((*shape, dim), dtype=torch.float32, device=q.device)]
        parts += [torch.empty(shape, dtype=torch.float32, device=q.device) for _ in "mt"]
    _attention_kernel[(tokens // block_q + num_seqs, kv_heads, segments)](
        out, q, cache.k, cache.v, cache.k_scale if fp8 else q, cache.v_scale if fp8 else q,
        meta.block_tables, meta.seq_lens, meta.query_start, *parts, scale, num_seqs, num_heads,
        head_dim, q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        cache.k.stride(0), cache.k.stride(1), cache.k.stride(2), meta.block_tables.stride(0),
        GROUP=group, BLOCK_Q=block_q, BLOCK_M=block_m, BLOCK_SIZE=block_size,
        TILE=tile, DIM=dim, FP8=fp8, SEGMENTS=segments, DOT_DTYPE=dot_dtype(q.dtype),
        PRECISION=dot_precision(q.dtype), INTERPRET=INTERPRET,
    )  # fmt: skip
    if segments > 1:
        _merge_segments[(tokens, num_heads)](
            out, *parts, num_heads, head_dim, out.stride(0), out.stride(1),
            SEGMENTS=segments, DIM=dim, INTERPRET=INTERPRET,
        )  # fmt: skip
    return out
