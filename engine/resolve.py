"""What a setting of 'auto' (device, dtype, attention backend) becomes on this machine; the
engine records the resolved value in its config."""

from __future__ import annotations

import importlib.util
import logging

import torch

from engine.dtype_choice import choose_dtype

logger = logging.getLogger(__name__)


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def resolve_dtype(dtype: str, device: torch.device) -> str:
    """'auto' is bfloat16 on CUDA; on CPU, float32 where bf16 is not native, else the faster
    of the two on this machine (engine/dtype_choice.py)."""
    return dtype if dtype != "auto" else choose_dtype(device).dtype


def resolve_attention_backend(backend: str, device: torch.device) -> str:
    """'auto' is triton on CUDA where the package is installed, torch elsewhere (on CPU
    Triton's kernels only run in its interpreter)."""
    has_triton = importlib.util.find_spec("triton") is not None
    if backend == "triton" and not has_triton:
        raise ValueError("attention_backend='triton' needs the triton package (pip install triton)")
    if backend == "auto":
        return "triton" if device.type == "cuda" and has_triton else "torch"
    if backend == "triton" and device.type != "cuda":
        import triton

        if not triton.knobs.runtime.interpret:
            raise ValueError(
                "attention_backend='triton' without CUDA needs Triton's interpreter: set "
                "TRITON_INTERPRET=1 before anything imports triton"
            )
        logger.warning("attention_backend='triton' without CUDA runs Triton's interpreter: slow")
    return backend
