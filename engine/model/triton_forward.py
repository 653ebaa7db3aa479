"""The forward of attention backend "triton": the Llama layer with its norms, rotary, cache
write and attention as the Triton kernels of engine/ops/triton, and the residual stream
carried beside the hidden state (as vLLM's layers do) so that each residual add is fused
into the norm after it. The adds happen in the same order as in LlamaForCausalLM.forward,
so the numbers are the eager model's up to the kernels' own rounding. On CUDA the kernels
are compiled; elsewhere they run in Triton's interpreter (slow: tests and checks only)."""

from __future__ import annotations

import torch

from engine.model.llama import LlamaDecoderLayer, LlamaForCausalLM
from engine.ops import AttentionMetadata, KVCache


def _layer(
    layer: LlamaDecoderLayer,
    x: torch.Tensor,
    residual: torch.Tensor | None,
    cos_sin: torch.Tensor,
    cache: KVCache,
    meta: AttentionMetadata,
) -> tuple[torch.Tensor, torch.Tensor]:
    from engine.ops import triton as kernels

    norm = layer.input_layernorm
    if residual is None:  # the first layer: the embeddings are the residual stream
        h, residual = kernels.rms_norm(x, norm.weight, norm.eps), x
    else:
        h, residual = kernels.add_rms_norm(x, residual, norm.weight, norm.eps)
    attn = layer.self_attn
    t = h.shape[0]
    q, k, v = attn.qkv_proj(h).split([attn.q_size, attn.kv_size, attn.kv_size], dim=-1)
    q, k = kernels.rotary_qk(
        q.view(t, attn.num_heads, attn.head_dim), k.view(t, attn.num_kv_heads, attn.head_dim),
        cos_sin,
    )  # fmt: skip
    v = v.view(t, attn.num_kv_heads, attn.head_dim)
    kernels.write_kv_cache(k, v, cache, meta.slot_mapping)
    o = kernels.paged_attention(q, cache, meta, attn.attn.scale)
    x = attn.reduce(attn.o_proj(o.view(t, attn.q_size)))
    norm = layer.post_attention_layernorm
    h, residual = kernels.add_rms_norm(x, residual, norm.weight, norm.eps)
    return layer.mlp(h), residual


def forward(
    model: LlamaForCausalLM,
    input_ids: torch.Tensor,  # [T]
    positions: torch.Tensor,  # [T]
    kv_caches: list[KVCache],
    meta: AttentionMetadata,
    num_layers: int | None = None,
) -> torch.Tensor:
    """[T, hidden], as LlamaForCausalLM.forward."""
    from engine.ops import triton as kernels

    x, cos_sin = model.embed(input_ids, positions)
    residual = None
    n = num_layers or len(model.layers)
    for layer, cache in zip(model.layers[:n], kv_caches[:n], strict=True):
        x, residual = _layer(layer, x, residual, cos_sin, cache, meta)
    return kernels.add_rms_norm(x, residual, model.norm.weight, model.norm.eps)[0]
