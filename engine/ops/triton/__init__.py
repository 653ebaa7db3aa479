"""Triton kernels with the same signatures as the torch reference ops in engine/ops: the
attention backend "triton" (engine/model/triton_forward.py). Importing this package needs
`triton`; without CUDA the kernels run in Triton's interpreter (`TRITON_INTERPRET=1`, which
engine/ops, this package's parent, sets before triton is imported): slow, for tests on CPU."""

from engine.ops.triton.attention import paged_attention
from engine.ops.triton.kv_cache import write_kv_cache
from engine.ops.triton.norm import add_rms_norm, rms_norm
from engine.ops.triton.rotary import apply_rotary, rotary_qk

__all__ = [
    "add_rms_norm",
    "apply_rotary",
    "paged_attention",
    "rms_norm",
    "rotary_qk",
    "write_kv_cache",
]
