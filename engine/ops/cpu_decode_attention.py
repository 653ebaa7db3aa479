"""Decode attention for CPU as one torch.compile'd kernel that reads K/V in the paged cache.

The eager path (`attention._gather`) copies every decode's blocks into a contiguous
[kv_heads, B, S, head_dim] tensor before two batched matmuls: at 64 sequences of ~320 tokens
that copy is ~31 MB (float32) written and read again per layer, and it, not the arithmetic,
sets the attention's time. Written as elementwise products and sums over an indexed view of
the cache, inductor emits C++ loops that look up the block table inside the reduction, so
nothing is materialized. Pure PyTorch, like the rest of engine/ops: no hand-written kernel.

Shapes are compiled once per (model, block size, dtype) with the batch, the blocks per
sequence and the pool size dynamic. Dynamo specializes sizes 0 and 1, so batches of one
sequence or one block stay eager (they are cheap) instead of compiling another graph.
`warm_up` compiles at engine start so a run's first decode does not pay for it; if this
machine cannot compile (no C++ compiler), it says so once and the engine stays eager."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable

import torch

from engine.ops import cpu_kernels

logger = logging.getLogger(__name__)


def decode_attention(
    q: torch.Tensor,  # [B, kv_heads, group, head_dim]
    k_cache: torch.Tensor,  # [kv_heads, num_blocks, block_size, head_dim]
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,  # [B, nb]
    mask: torch.Tensor,  # [B, nb * block_size] bool: key j is in the context
    scale: float,
) -> torch.Tensor:  # [B, kv_heads, group, head_dim]
    """Indexed by whole blocks, so the generated loops read a block-table entry once per
    block, not per key; softmax is normalized after the weighted sum, not per key; and the
    weighted sum of V is taken per block first (a 4 KB block stays in L1 while all of its
    outputs are summed), then over blocks. Each step was measured:
    docs/results/2026-12-04-cpu-design-choices.md."""
    heads = k_cache.shape[0]
    b, nb = block_tables.shape
    head = torch.arange(heads, device=q.device)[:, None, None]
    k = k_cache[head, block_tables[None]].to(q.dtype)  # [kv_heads, B, nb, bs, hd], never stored
    v = v_cache[head, block_tables[None]].to(q.dtype)
    qh = q.transpose(0, 1)[:, :, :, None, None, :]  # [kv_heads, B, group, 1, 1, head_dim]
    scores = (qh * k[:, :, None]).sum(-1) * scale  # [kv_heads, B, group, nb, bs]
    scores = scores.view(heads, b, -1, mask.shape[1])
    scores = scores.masked_fill(~mask[None, :, None, :], float("-inf"))
    weights = (scores - scores.amax(-1, keepdim=True)).exp()
    per_block = (weights.view(heads, b, -1, nb, k.shape[3], 1) * v[:, :, None]).sum(-2)
    return (per_block.sum(-2) / weights.sum(-1, keepdim=True)).transpose(0, 1)


def paged_decode_attention(
    q: torch.Tensor,  # [B, kv_heads, group, head_dim]
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    mask: torch.Tensor,
    scale: float,
    fallback: Callable[..., torch.Tensor] = decode_attention,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """What the compiled forward's decodes attend with: the engine's kernel (ops/
    cpu_attention.cpp) on float32 and bf16 caches where it is built, which reads each K and V
    row once in place (inductor's loops over the formula read the cache at 5-8 GB/s at 64
    sequences), else `fallback`: the formula inside a compiled graph, `fused_decode_attention`
    outside one. With scales, an fp8 cache through the kernel's e4m3 variant (callers check
    `fp8_kernel_fits`)."""
    if k_scale is not None and v_scale is not None:
        fp8 = torch.ops.servebench.decode_attention_fp8
        return fp8(q, k_cache, v_cache, block_tables, mask, scale, k_scale, v_scale)
    if kernel_fits(q, k_cache):  # bf16: float32 queries and outputs (q is a few KB)
        kernel = torch.ops.servebench.decode_attention
        return kernel(q.float(), k_cache, v_cache, block_tables, mask, scale).to(q.dtype)
    return fallback(q, k_cache, v_cache, block_tables, mask, scale)


def kernel_fits(q: torch.Tensor, k_cache: torch.Tensor) -> bool:
    """Whether the engine's attention kernels (ops/cpu_attention.cpp's decode,
    ops/cpu_prefill_attention.cpp's prefill) take these queries: a float32 cache, or a bf16
    one (rows widened in registers, exactly) under bf16 queries."""
    fits = q.dtype == k_cache.dtype and q.dtype in (torch.float32, torch.bfloat16)
    fits = fits and q.shape[-1] in (64, 128)
    return fits and k_cache.device.type == "cpu" and cpu_kernels.BUILT["ok"]


def fp8_kernel_fits(dtype: torch.dtype, k_cache: torch.Tensor) -> bool:
    """Whether the kernel's e4m3 variant (`servebench::decode_attention_fp8`) reads this cache
    for queries in `dtype`: float32 queries over an fp8 cache with heads of 64 or 128, K/V
    upcast in registers (the eager path gathers and dequantizes every block it reads first)."""
    fits = dtype == torch.float32 and k_cache.dtype == torch.float8_e4m3fn
    fits = fits and k_cache.shape[-1] in (64, 128) and k_cache.device.type == "cpu"
    return fits and cpu_kernels.available()


_state = {"enabled": True, "compiled_afresh": False}
_compiled_shapes: set[tuple] = set()
MAX_SHAPES = 6  # dynamo compiles one function at most 8 ways, then runs it eagerly


@functools.cache
def _compiled() -> Callable[..., torch.Tensor]:
    return torch.compile(decode_attention, dynamic=False)  # dynamic dims: marked per call


def fused_decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    mask: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    dynamic = ((q, 0), (block_tables, 0), (block_tables, 1), (mask, 0), (mask, 1))
    for t, dim in (*dynamic, (k_cache, 1), (v_cache, 1)):  # batch, blocks, pool size
        torch._dynamo.maybe_mark_dynamic(t, dim)
    return _compiled()(q, k_cache, v_cache, block_tables, mask, scale)


def usable(batch: int, blocks: int) -> bool:
    """Whether a decode batch of this shape takes the compiled kernel (see module doc)."""
    return _state["enabled"] and batch >= 2 and blocks >= 2


def check_tolerance(dtype: torch.dtype) -> float:
    """How far a correct kernel computing in `dtype` may be from the float32 formula: a few
    rounding steps of the output's dtype (bf16 keeps 8 bits of mantissa, float32 24). A wrong
    kernel (a dropped mask, a wrong scale) is off by tenths on the warm-up's random inputs."""
    return max(1e-3, 4 * torch.finfo(dtype).eps)


def warm_up(k_cache: torch.Tensor, group: int, dtype: torch.dtype, scale: float) -> bool:
    """Compile for this cache's shape now, on a 2-sequence, 2-block batch, and check it
    against the eager formula computed in float32. False (and eager from then on) if
    compiling fails.

    Dynamo guards on grad mode and on whether a tensor was made under inference mode, so
    the warm-up call mirrors a step: the cache made outside, the rest inside."""
    if not _state["enabled"]:
        return False
    heads, _, block_size, head_dim = k_cache.shape
    shape = (heads, group, block_size, head_dim, k_cache.dtype, dtype, k_cache.device)
    if shape not in _compiled_shapes and len(_compiled_shapes) >= MAX_SHAPES:
        return False
    dev = k_cache.device
    gen = torch.Generator().manual_seed(0)
    k = torch.randn(heads, 4, block_size, head_dim, generator=gen).to(dev, k_cache.dtype)
    v = torch.randn(heads, 4, block_size, head_dim, generator=gen).to(dev, k_cache.dtype)
    with torch.inference_mode():
        q = torch.randn(2, heads, group, head_dim, generator=gen).to(dev, dtype)
        tables = torch.tensor([[0, 2], [3, 1]], device=dev)
        lens = torch.tensor([[block_size + 1], [2 * block_size]], device=dev)
        mask = torch.arange(2 * block_size, device=dev)[None] < lens
        misses = _inductor_cache_misses()
        try:
            got = fused_decode_attention(q, k, v, tables, mask, scale)
        except Exception as e:  # inductor needs a working C++ toolchain
            logger.warning("compiled decode attention unavailable, staying eager: %s", e)
            _state["enabled"] = False
            return False
        want = decode_attention(q.float(), k.float(), v.float(), tables, mask, scale)
    tol = check_tolerance(dtype)
    if not torch.allclose(got.float(), want, rtol=tol, atol=tol):
        err = (got.float() - want).abs().max().item()
        raise RuntimeError(
            f"compiled decode attention disagrees with its float32 formula: max error {err:.3g}"
            f" (allowed {tol:.3g} in {dtype})"
        )
    _compiled_shapes.add(shape)
    _state["compiled_afresh"] |= _inductor_cache_misses() > misses
    return True


def compiled_afresh() -> bool:
    """Whether this process compiled the kernel (C++, seconds of CPU) instead of loading it
    from inductor's on-disk cache: a machine's first run is slower to start than the next."""
    return _state["compiled_afresh"]


def _inductor_cache_misses() -> int:
    """Graphs inductor compiled because its cache had none (a private counter: 0 if gone)."""
    try:
        from torch._dynamo.utils import counters

        return int(counters["inductor"]["fxgraph_cache_miss"])
    except Exception:
        return 0
