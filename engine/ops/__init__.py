"""Compute ops. Each pure-PyTorch function here is the CPU path and the test oracle for a
Triton kernel of the same signature (engine/ops/triton)."""

import os
import sys

import torch

# Without CUDA, Triton kernels can only run in its interpreter, which `triton.jit` picks when
# a function is defined, the library's own at `import triton`: set it before anything (torch's
# compiler included) imports triton.
if "triton" not in sys.modules and not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from engine.ops.attention import AttentionMetadata, KVCache, paged_attention, write_kv_cache
from engine.ops.layers import (
    add_rms_norm,
    apply_rotary,
    rms_norm,
    rotary_cos_sin,
    rotary_qk,
    silu_and_mul,
)

__all__ = [
    "AttentionMetadata",
    "KVCache",
    "add_rms_norm",
    "apply_rotary",
    "paged_attention",
    "rms_norm",
    "rotary_cos_sin",
    "rotary_qk",
    "silu_and_mul",
    "write_kv_cache",
]
