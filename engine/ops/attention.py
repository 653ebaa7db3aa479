"""Paged attention: K/V live in fixed-size blocks and are read only through per-request
block tables. On CPU the engine's kernels take decodes (ops/cpu_attention.cpp) and prefill
chunks (ops/cpu_prefill_attention.cpp) where they fit; the PyTorch formula here takes the
rest, and is what the kernels are tested against.

A step's tokens come decode-first: the first `num_decode_tokens` are single-token queries
(decodes, or one-token prefill chunks); the rest are prefill chunks of any length, each
attending to its request's earlier cached tokens and causally to itself."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from engine.ops import cpu_decode_attention
from engine.ops.cpu_decode_attention import (
    fp8_kernel_fits,
    fused_decode_attention,
    kernel_fits,
    paged_decode_attention,
)
from engine.ops.fp8 import quantize, upcast


@dataclass(slots=True)
class KVCache:
    """One layer's paged K and V, head-major [kv_heads, num_blocks, block_size, head_dim].

    They may be stored in another dtype than the model computes in (bf16 storage under a
    float32 model, or fp8); fp8 caches carry a float32 scale per KV head, [kv_heads, 1, 1]."""

    k: torch.Tensor
    v: torch.Tensor
    k_scale: torch.Tensor | None = None
    v_scale: torch.Tensor | None = None


@dataclass(slots=True)
class AttentionMetadata:
    """Built once per step by the runner and read by every layer."""

    slot_mapping: torch.Tensor  # [T] cache slot (block * block_size + offset) of each new token
    num_decode_tokens: int
    decode_block_tables: torch.Tensor  # [Bd, nb] int64
    decode_mask: torch.Tensor  # [Bd, 1, 1, nb * block_size] bool: key j is in the context
    decode_fused: bool  # decodes take the compiled CPU kernel (cpu_decode_attention.py)
    prefill_block_tables: torch.Tensor  # [Bp, nb] int64
    prefill_gather: torch.Tensor  # [Bp, Qp] index of each padded query among prefill tokens
    prefill_scatter: torch.Tensor  # [Tp] index of each prefill token in the flat [Bp * Qp]
    prefill_mask: torch.Tensor | None  # [Bp, 1, Qp, nb * block_size] bool: causal, in context
    # None when every prefill chunk starts at position 0: then plain causal masking is exact
    # for real query rows, and SDPA's causal kernel is much faster than an explicit mask.
    # The same step unpadded, for one-launch kernels (ops/triton/attention.py); int32, as the
    # kernel's index arithmetic is cheapest in it:
    block_tables: torch.Tensor  # [B, nb], every request, decodes first
    seq_lens: torch.Tensor  # [B]: cached tokens + this step's
    query_start: torch.Tensor  # [B + 1]: where each request's tokens start in the step

    @classmethod
    def build(
        cls,
        starts: np.ndarray,  # [B] tokens each request has cached
        q_lens: np.ndarray,  # [B] tokens it computes in this step; single tokens first
        tables: np.ndarray,  # [B, >= blocks needed] int64 block tables
        block_size: int,
        device: torch.device,
        fuse_decodes: bool = False,
        positions: np.ndarray
        | None = None,  # token_positions(starts, q_lens), if the caller has it
    ) -> AttentionMetadata:
        """The metadata of one step: slots of the new tokens, the padded decode and prefill
        views the torch path reads, and the flat view the Triton kernel reads."""
        bs = block_size
        seq_lens = starts + q_lens
        owner = np.repeat(np.arange(len(q_lens)), q_lens)
        pos = token_positions(starts, q_lens) if positions is None else positions
        slots = tables[owner, pos // bs] * bs + pos % bs
        tables = tables[:, : int(-(-seq_lens.max() // bs))]
        nd = int((q_lens == 1).sum())  # decodes come first

        def t(a: np.ndarray) -> torch.Tensor:
            return torch.from_numpy(np.ascontiguousarray(a)).to(device)

        # Decode: one query per request; key j is valid while j < seq_len.
        d_blocks = int(-(-seq_lens[:nd].max() // bs)) if nd else 0
        d_keys = np.arange(d_blocks * bs)
        d_mask = (d_keys[None, :] < seq_lens[:nd, None])[:, None, None, :]

        # Prefill: queries padded to the longest chunk; query i of a request sees keys up to
        # its own position (pad rows repeat the last real row, so no row is fully masked).
        pq = q_lens[nd:]
        p_blocks = int(-(-seq_lens[nd:].max() // bs)) if len(pq) else 0
        q_max = int(pq.max()) if len(pq) else 0
        qi = np.arange(q_max)
        real = qi[None, :] < pq[:, None]  # [Bp, Qp]
        p_first = np.cumsum(pq) - pq
        gather = np.where(real, p_first[:, None] + qi[None, :], 0)
        scatter = (np.arange(len(pq))[:, None] * q_max + qi[None, :])[real]
        p_mask = None
        if starts[nd:].any():
            q_pos = starts[nd:, None] + np.minimum(qi[None, :], pq[:, None] - 1)
            p_keys = np.arange(p_blocks * bs)
            p_mask = t((p_keys[None, None, :] <= q_pos[:, :, None])[:, None, :, :])

        return cls(
            slot_mapping=t(slots),
            num_decode_tokens=nd,
            decode_block_tables=t(tables[:nd, :d_blocks]),
            decode_mask=t(d_mask),
            decode_fused=fuse_decodes and cpu_decode_attention.usable(nd, d_blocks),
            prefill_block_tables=t(tables[nd:, :p_blocks]),
            prefill_gather=t(gather),
            prefill_scatter=t(scatter),
            prefill_mask=p_mask,
            block_tables=t(tables.astype(np.int32)),
            seq_lens=t(seq_lens.astype(np.int32)),
            query_start=t(np.concatenate(([0], np.cumsum(q_lens))).astype(np.int32)),
        )


def token_positions(starts: np.ndarray, q_lens: np.ndarray) -> np.ndarray:
    """Absolute position of each of a step's tokens: its request's start + its offset."""
    owner = np.repeat(np.arange(len(q_lens)), q_lens)
    first = np.cumsum(q_lens) - q_lens
    return starts[owner] + np.arange(int(q_lens.sum())) - first[owner]


def write_kv_cache(
    k: torch.Tensor,  # [T, kv_heads, head_dim]
    v: torch.Tensor,
    cache: KVCache,
    slot_mapping: torch.Tensor,  # [T]
) -> None:
    for new, dst, scale in ((k, cache.k, cache.k_scale), (v, cache.v, cache.v_scale)):
        heads, _, _, head_dim = dst.shape
        new = new.transpose(0, 1)  # [kv_heads, T, head_dim]
        if scale is not None:
            # index_copy_ has no fp8 kernel on CPU: copy the bytes.
            new, dst = quantize(new, scale).view(torch.uint8), dst.view(torch.uint8)
        dst.view(heads, -1, head_dim).index_copy_(1, slot_mapping, new.to(dst.dtype))


def _gather(
    cache: torch.Tensor, scale: torch.Tensor | None, block_tables: torch.Tensor, dtype: torch.dtype
) -> torch.Tensor:
    """[B, nb] block tables -> keys or values [kv_heads, B, nb * block_size, head_dim] in
    `dtype`, contiguous (transpose(0, 1) for SDPA's batch-first layout).

    The cache is head-major so that each gathered head is one contiguous [tokens, head_dim]
    matrix: attention's matmuls run on it in place (SDPA measured faster than on a
    token-major layout's strided view). An fp8 cache is dequantized after the gather, so only
    the blocks read are converted."""
    heads, _, block_size, head_dim = cache.shape
    b, nb = block_tables.shape
    gathered = cache.index_select(1, block_tables.flatten())  # [heads, B * nb, bs, head_dim]
    if scale is not None:
        gathered, factor = upcast(gathered, dtype)
        gathered *= (scale[:, :, :, None] * factor).to(dtype)
    else:
        gathered = gathered.to(dtype)
    return gathered.view(heads, b, nb * block_size, head_dim)


def _decode_attention_math(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float
) -> torch.Tensor:
    """Softmax(q k^T) v for decodes as two batched matmuls over (KV head, sequence), the order
    the gather leaves K and V in, so nothing is copied. q: [B, kv_heads, group, head_dim];
    k, v: [kv_heads, B, S, head_dim]; mask: [B, 1, 1, S]. On CPU this beat SDPA, which wants
    a batch-first K/V (a strided view it copies)."""
    qh = q.transpose(0, 1)  # [kv_heads, B, group, head_dim], a view
    scores = torch.matmul(qh, k.transpose(-1, -2)).mul_(scale)
    scores.masked_fill_(~mask.view(1, -1, 1, mask.shape[-1]), float("-inf"))
    return torch.matmul(scores.softmax(dim=-1), v).transpose(0, 1)


def _eager_decode(
    q: torch.Tensor, cache: KVCache, meta: AttentionMetadata, scale: float
) -> torch.Tensor:
    k = _gather(cache.k, cache.k_scale, meta.decode_block_tables, q.dtype)
    v = _gather(cache.v, cache.v_scale, meta.decode_block_tables, q.dtype)
    if q.device.type == "cpu":
        return _decode_attention_math(q, k, v, meta.decode_mask, scale)
    k, v = k.transpose(0, 1), v.transpose(0, 1)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=meta.decode_mask, scale=scale)


def paged_attention(
    q: torch.Tensor,  # [T, heads, head_dim]
    cache: KVCache,
    meta: AttentionMetadata,
    scale: float,
) -> torch.Tensor:
    num_tokens, num_heads, head_dim = q.shape
    num_kv_heads = cache.k.shape[0]
    nd = meta.num_decode_tokens
    out = torch.empty_like(q)
    if nd:
        # Fold the query heads that share a KV head into the query axis: no K/V repeat.
        qd = q[:nd].view(nd, num_kv_heads, num_heads // num_kv_heads, head_dim)
        mask, tables = meta.decode_mask.view(nd, -1), meta.decode_block_tables
        fp8 = cache.k_scale is not None and fp8_kernel_fits(q.dtype, cache.k)
        if meta.decode_fused or fp8:  # the engine's kernel where it fits, else inductor's
            o = paged_decode_attention(
                qd, cache.k, cache.v, tables, mask, scale, fused_decode_attention,
                cache.k_scale, cache.v_scale,
            )  # fmt: skip
        else:
            o = _eager_decode(qd, cache, meta, scale)
        out[:nd] = o.reshape(nd, num_heads, head_dim)
    if nd < num_tokens and kernel_fits(q, cache.k):
        # The engine's kernel (ops/cpu_prefill_attention.cpp): the chunks' K/V read in place.
        o = torch.ops.servebench.prefill_attention(
            q[nd:], cache.k, cache.v, meta.block_tables[nd:], meta.seq_lens[nd:],
            meta.query_start[nd:] - nd, scale,
        )  # fmt: skip
        if not nd:
            return o
        out[nd:] = o
    elif nd < num_tokens:
        bp, qp = meta.prefill_gather.shape
        qpad = q[nd:][meta.prefill_gather].transpose(1, 2)  # [Bp, heads, Qp, head_dim]
        k = _gather(cache.k, cache.k_scale, meta.prefill_block_tables, q.dtype).transpose(0, 1)
        v = _gather(cache.v, cache.v_scale, meta.prefill_block_tables, q.dtype).transpose(0, 1)
        o = F.scaled_dot_product_attention(
            qpad,
            k,
            v,
            attn_mask=meta.prefill_mask,
            is_causal=meta.prefill_mask is None,
            scale=scale,
            enable_gqa=True,
        )
        out[nd:] = o.transpose(1, 2).reshape(bp * qp, num_heads, head_dim)[meta.prefill_scatter]
    return out
