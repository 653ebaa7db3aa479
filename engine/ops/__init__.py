"""Compute ops. Each pure-PyTorch function here is the CPU path and the test oracle for a
Triton kernel of the same signature."""

from engine.ops.attention import AttentionMetadata, KVCache, paged_attention, write_kv_cache
from engine.ops.layers import apply_rotary, rms_norm, rotary_cos_sin, silu_and_mul

__all__ = [
    "AttentionMetadata",
    "KVCache",
    "apply_rotary",
    "paged_attention",
    "rms_norm",
    "rotary_cos_sin",
    "silu_and_mul",
    "write_kv_cache",
]
