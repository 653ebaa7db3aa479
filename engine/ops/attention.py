"""Paged attention in pure PyTorch: K/V live in fixed-size blocks and are read only
through per-request block tables.

A step's tokens come decode-first: the first `num_decode_tokens` are single-token queries
(decodes, or one-token prefill chunks); the rest are prefill chunks of any length, each
attending to its request's earlier cached tokens and causally to itself."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass(slots=True)
class AttentionMetadata:
    """Built once per step by the runner and read by every layer."""

    slot_mapping: torch.Tensor  # [T] cache slot (block * block_size + offset) of each new token
    num_decode_tokens: int
    decode_block_tables: torch.Tensor  # [Bd, nb] int64
    decode_mask: torch.Tensor  # [Bd, 1, 1, nb * block_size] bool: key j is in the context
    prefill_block_tables: torch.Tensor  # [Bp, nb] int64
    prefill_gather: torch.Tensor  # [Bp, Qp] index of each padded query among prefill tokens
    prefill_scatter: torch.Tensor  # [Tp] index of each prefill token in the flat [Bp * Qp]
    prefill_mask: torch.Tensor | None  # [Bp, 1, Qp, nb * block_size] bool: causal, in context
    # None when every prefill chunk starts at position 0: then plain causal masking is exact
    # for real query rows, and SDPA's causal kernel is much faster than an explicit mask.


def write_kv_cache(
    k: torch.Tensor,  # [T, kv_heads, head_dim]
    v: torch.Tensor,
    k_cache: torch.Tensor,  # [kv_heads, num_blocks, block_size, head_dim]
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,  # [T]
) -> None:
    heads, _, _, head_dim = k_cache.shape
    k_cache.view(heads, -1, head_dim).index_copy_(1, slot_mapping, k.transpose(0, 1))
    v_cache.view(heads, -1, head_dim).index_copy_(1, slot_mapping, v.transpose(0, 1))


def _gather(cache: torch.Tensor, block_tables: torch.Tensor) -> torch.Tensor:
    """[B, nb] block tables -> keys or values [B, kv_heads, nb * block_size, head_dim].

    The cache is head-major so that each gathered head is one contiguous [tokens, head_dim]
    matrix: attention's matmuls run on it in place (measured ~1.6x faster SDPA than a
    token-major layout's strided view)."""
    heads, _, block_size, head_dim = cache.shape
    b, nb = block_tables.shape
    gathered = cache.index_select(1, block_tables.flatten())  # [heads, B * nb, bs, head_dim]
    return gathered.view(heads, b, nb * block_size, head_dim).transpose(0, 1)


def paged_attention(
    q: torch.Tensor,  # [T, heads, head_dim]
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
) -> torch.Tensor:
    num_tokens, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[0]
    nd = meta.num_decode_tokens
    out = torch.empty_like(q)
    if nd:
        # Fold the query heads that share a KV head into the query axis: no K/V repeat.
        qd = q[:nd].view(nd, num_kv_heads, num_heads // num_kv_heads, head_dim)
        k = _gather(k_cache, meta.decode_block_tables)
        v = _gather(v_cache, meta.decode_block_tables)
        o = F.scaled_dot_product_attention(qd, k, v, attn_mask=meta.decode_mask, scale=scale)
        out[:nd] = o.reshape(nd, num_heads, head_dim)
    if nd < num_tokens:
        bp, qp = meta.prefill_gather.shape
        qpad = q[nd:][meta.prefill_gather].transpose(1, 2)  # [Bp, heads, Qp, head_dim]
        k = _gather(k_cache, meta.prefill_block_tables)
        v = _gather(v_cache, meta.prefill_block_tables)
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
