"""The decode forward for CPU through torch.compile: a step of decodes only runs each decoder
layer as one compiled graph, in which inductor fuses the norms, rotary, SiLU, residual adds,
the cache write and the attention (ops/cpu_decode_attention.py's formula, reading K/V in the
paged cache) into C++ loops between the linears, which stay oneDNN's packed products.

Eagerly, a decode step at a few sequences spent about as long in those small ops and their
Python dispatch as in the linears (`bench profile`; figures in the README, "Measured design
choices"). One graph serves every layer (their weights are inputs of the graph, not
constants) and every batch: the batch, blocks per sequence and pool size are dynamic, so one
sequence, or one block, compiles once more (dynamo specializes sizes 1), and nothing is padded.
Steps with a prefill chunk run the eager model. `warm_up` compiles at engine start and checks
the compiled layer against the eager one; a machine that cannot compile stays eager."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable

import torch

from engine.model.llama import LlamaDecoderLayer, LlamaForCausalLM
from engine.ops import KVCache

logger = logging.getLogger(__name__)

_state = {"enabled": True}
MAX_SHAPES = 24  # model/cache/dtype combinations compiled in one process (tests build many)


def _layer_decode(
    layer: LlamaDecoderLayer,
    x: torch.Tensor,
    cos_sin: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slots: torch.Tensor,
    block_tables: torch.Tensor,
    mask: torch.Tensor,
) -> torch.Tensor:
    return layer.decode(x, cos_sin, k_cache, v_cache, slots, block_tables, mask)


@functools.cache
def _compiled() -> Callable[..., torch.Tensor]:
    # Dynamo recompiles one function at most `recompile_limit` ways (8 by default), then runs
    # it eagerly without a word; each (layer shape, dtype, block size) with one and several
    # sequences is two ways. vLLM raises the same limit for its compiled models.
    config = torch._dynamo.config
    config.recompile_limit = max(config.recompile_limit, 2 * MAX_SHAPES + 8)
    return torch.compile(_layer_decode, dynamic=False)  # dynamic dims: marked per call


_compiled_shapes: set[tuple] = set()


def _mark_dynamic(
    x: torch.Tensor, cos_sin: torch.Tensor, slots: torch.Tensor, tables: torch.Tensor,
    mask: torch.Tensor, caches: list[KVCache],
) -> None:  # fmt: skip
    for t in (x, cos_sin, slots, tables, mask):
        torch._dynamo.maybe_mark_dynamic(t, 0)  # sequences
    torch._dynamo.maybe_mark_dynamic(tables, 1)  # blocks per sequence
    torch._dynamo.maybe_mark_dynamic(mask, 1)
    for cache in caches:
        torch._dynamo.maybe_mark_dynamic(cache.k, 1)  # pool size
        torch._dynamo.maybe_mark_dynamic(cache.v, 1)


def decode_forward(
    model: LlamaForCausalLM,
    input_ids: torch.Tensor,  # [B]
    positions: torch.Tensor,  # [B]
    kv_caches: list[KVCache],
    slots: torch.Tensor,  # [B]
    block_tables: torch.Tensor,  # [B, nb]
    mask: torch.Tensor,  # [B, nb * block_size] bool
) -> torch.Tensor:
    """The model's forward for one token of each of B sequences, [B, hidden]."""
    assert model.cos_sin is not None, "call prepare() first"
    cos_sin = model.cos_sin[positions]
    x = model.embed_tokens(input_ids)
    _mark_dynamic(x, cos_sin, slots, block_tables, mask, kv_caches)
    step = _compiled()
    for layer, cache in zip(model.layers, kv_caches, strict=True):
        x = step(layer, x, cos_sin, cache.k, cache.v, slots, block_tables, mask)
    return model.norm(x)


def supported(model: LlamaForCausalLM, kv_cache: KVCache) -> bool:
    """Plain or oneDNN-packed linears and an unscaled cache: fp8 weights and caches take the
    eager path, whose dequantization this graph does not have."""
    from engine.ops.cpu_linear import PackedLinear

    linears = (getattr(parent, name) for parent, name in model._layer_linears())
    plain = all(isinstance(m, torch.nn.Linear | PackedLinear) for m in linears)
    return plain and kv_cache.k_scale is None and kv_cache.k.device.type == "cpu"


def warm_up(model: LlamaForCausalLM, kv_cache: KVCache) -> bool:
    """Compile for this model and cache now (one sequence and two, two blocks each, on a
    scratch cache) and check the compiled layer against the eager one. False, and eager from
    then on for every model, if compiling fails; a compiled layer that disagrees raises."""
    if not _state["enabled"] or not supported(model, kv_cache):
        return False
    layer = model.layers[0]
    p = model.embed_tokens.weight
    heads, _, block_size, head_dim = kv_cache.k.shape
    key = (type(model).__name__, tuple(p.shape), len(model.layers), heads, block_size,
           head_dim, p.dtype, kv_cache.k.dtype, str(p.device))  # fmt: skip
    if key not in _compiled_shapes and len(_compiled_shapes) >= MAX_SHAPES:
        return False
    gen = torch.Generator().manual_seed(0)
    cache_shape = (heads, 4, block_size, head_dim)
    k = torch.randn(cache_shape, generator=gen).to(kv_cache.k.dtype)
    v = torch.randn(cache_shape, generator=gen).to(kv_cache.k.dtype)
    with torch.inference_mode():
        for b in (1, 2):
            x = torch.randn(b, p.shape[1], generator=gen).to(p.dtype)
            cos_sin = model.cos_sin[torch.tensor([block_size, 2 * block_size - 1])[:b]]
            slots = torch.tensor([block_size, 3 * block_size + 5])[:b]
            tables = torch.tensor([[0, 1], [3, 2]])[:b]
            lens = torch.tensor([[block_size + 1], [2 * block_size]])[:b]
            mask = torch.arange(2 * block_size)[None] < lens
            args = (cos_sin, slots, tables, mask)
            want = layer.decode(x, cos_sin, k.clone(), v.clone(), *args[1:])
            _mark_dynamic(x, *args, [KVCache(k, v)])
            try:
                got = _compiled()(layer, x, cos_sin, k.clone(), v.clone(), *args[1:])
            except Exception as e:  # inductor needs a working C++ toolchain
                logger.warning("compiled decode forward unavailable, staying eager: %s", e)
                _state["enabled"] = False
                return False
            tol = max(1e-4, 8 * torch.finfo(p.dtype).eps)
            scale = want.float().abs().max().item()
            err = (got.float() - want.float()).abs().max().item()
            if err > tol * max(scale, 1.0):
                raise RuntimeError(
                    f"the compiled decode layer disagrees with the eager one: max error "
                    f"{err:.3g} on values up to {scale:.3g} (allowed {tol:.3g} relative)"
                )
    _compiled_shapes.add(key)
    return True
