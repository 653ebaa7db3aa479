"""RMSNorm, rotary embeddings and the SwiGLU activation, numerically as in HF Llama."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    # Normalise in float32, scale in the model dtype: the same rounding as the reference.
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


def add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(rms_norm(x + residual), x + residual): the residual stream's add and the next norm,
    one kernel in the Triton backend."""
    total = x + residual
    return rms_norm(total, weight, eps), total


def rotary_cos_sin(
    head_dim: int, max_positions: int, theta: float, dtype: torch.dtype, device: torch.device
) -> torch.Tensor:
    """[max_positions, 2, head_dim] table of cos and sin, in the 'rotate half' layout."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    t = torch.arange(max_positions, dtype=torch.float32)
    freqs = torch.outer(t, inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    return torch.stack((emb.cos(), emb.sin()), dim=1).to(dtype=dtype, device=device)


def apply_rotary(x: torch.Tensor, cos_sin: torch.Tensor) -> torch.Tensor:
    """x: [T, heads, head_dim]; cos_sin: [T, 2, head_dim] rows already picked by position."""
    cos = cos_sin[:, 0].unsqueeze(1)
    sin = cos_sin[:, 1].unsqueeze(1)
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


def rotary_qk(
    q: torch.Tensor, k: torch.Tensor, cos_sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Both rotated (one in-place kernel in the Triton backend)."""
    return apply_rotary(q, cos_sin), apply_rotary(k, cos_sin)


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up
