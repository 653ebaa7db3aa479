"""The forward for CPU through torch.compile, in two kinds of graph whose weights are inputs
(not constants), so that layers of one shape share them:

- decode: a step of decodes only runs its layers LAYERS_PER_GRAPH at a time as one graph, in
  which inductor fuses the norms, rotary, SiLU, residual adds, the cache write and the
  attention (ops/cpu_decode_attention.py's formula or kernel, reading K/V in the paged cache)
  into C++ loops between the linears, which stay ops (ops/cpu_linear.py: `servebench::linear`,
  or `packed_linear`). Five layers to a graph rather than one: each call of a compiled
  function paid dynamo's guards and AOT's wrappers (~0.1 ms here), which at one sequence was
  ~3 ms of a ~30 ms SmolLM2 step; ten layers a graph measured no faster, and the whole model
  as one graph compiled ~6x longer (docs/results/2026-12-04-cpu-design-choices.md).
  Calls after the first of each kind now skip dynamo (engine/model/direct_graph.py).
- step: any other step (prefill chunks, alone or beside decodes) runs each layer with its
  attention as an opaque op, `servebench::paged_attention`, which takes the step's metadata and
  the layer's cache from the step being computed (as vLLM's attention op reads its forward
  context): the graph runs up to it and on after it, and inductor fuses what is on either side.

Eagerly, a decode step at a few sequences spent about as long in those small ops and their
Python dispatch as in the linears (`bench profile`; figures: docs/results/2026-12-04-cpu-
design-choices.md). Sizes are dynamic (tokens, sequences, blocks per sequence, pool size),
so nothing is padded. Tokens, sequences and blocks are marked unbacked: dynamo would
otherwise specialize a size of 1 and compile again for one sequence or one block, mid-run,
where the first prompt shorter than a block came. `warm_up` compiles at engine start and
checks each compiled kind against the eager model; a machine that cannot compile stays
eager."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass

import torch

from engine.model.direct_graph import DirectCompiled
from engine.model.llama import LlamaDecoderLayer, LlamaForCausalLM
from engine.ops import AttentionMetadata, KVCache, cpu_kernels, paged_attention, write_kv_cache
from engine.ops.cpu_decode_attention import fp8_kernel_fits

logger = logging.getLogger(__name__)

_state = {"enabled": True}
MAX_SHAPES = 24  # model/cache/dtype combinations compiled in one process (tests build many)


LAYERS_PER_GRAPH = 5


def _layers_decode(
    layers: list[LlamaDecoderLayer],
    x: torch.Tensor,
    cos_sin: torch.Tensor,
    k_caches: list[torch.Tensor],
    v_caches: list[torch.Tensor],
    slots: torch.Tensor,
    block_tables: torch.Tensor,
    mask: torch.Tensor,
    scales: list[tuple[torch.Tensor, torch.Tensor]] | None = None,  # an fp8 cache's, per layer
) -> torch.Tensor:
    for i, (layer, k_cache, v_cache) in enumerate(zip(layers, k_caches, v_caches, strict=True)):
        k_scale, v_scale = scales[i] if scales is not None else (None, None)
        x = layer.decode(x, cos_sin, k_cache, v_cache, slots, block_tables, mask, k_scale, v_scale)
    return x


def _groups(n: int) -> list[slice]:
    """The first n layers as graphs of LAYERS_PER_GRAPH, the last one shorter if need be."""
    return [slice(i, min(i + LAYERS_PER_GRAPH, n)) for i in range(0, n, LAYERS_PER_GRAPH)]


@dataclass
class _Step:
    """The step being computed by `step_forward`: what its attention op reads."""

    caches: list[KVCache]
    meta: AttentionMetadata
    layer: int = 0  # the next layer to attend: layers call the op once each, in order


_current: list[_Step] = []


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """What `servebench::paged_attention` runs (eagerly, between the graph's two halves)."""
    step = _current[-1]
    cache = step.caches[step.layer]
    step.layer += 1
    write_kv_cache(k, v, cache, step.meta.slot_mapping)
    return paged_attention(q, cache, step.meta, scale)


_lib = torch.library.Library("servebench", "FRAGMENT")
_lib.define("paged_attention(Tensor q, Tensor k, Tensor v, float scale) -> Tensor")
# Through the module's name, so that a profiler can time it (bench_cli/profile/capture.py).
_lib.impl("paged_attention", lambda *args: attend(*args), "CompositeExplicitAutograd")


@torch.library.register_fake("servebench::paged_attention")
def _(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    return torch.empty_like(q)


def _layer_step(layer: LlamaDecoderLayer, x: torch.Tensor, cos_sin: torch.Tensor) -> torch.Tensor:
    q, k, v = layer.attention_inputs(x, cos_sin)
    o = torch.ops.servebench.paged_attention(q, k, v, layer.self_attn.attn.scale)
    return layer.attention_output(x, o)


KINDS = {"decode": _layers_decode, "step": _layer_step}


@functools.cache
def _compiled(kind: str) -> DirectCompiled:
    # Dynamo recompiles one function at most `recompile_limit` ways (8 by default), then runs
    # it eagerly without a word; each (layer shape, dtype, block size), in graphs of
    # LAYERS_PER_GRAPH layers and of the rest, is up to two ways (the limit leaves room for
    # twice that). vLLM raises the same limit for its compiled models.
    config = torch._dynamo.config
    config.recompile_limit = max(config.recompile_limit, 4 * MAX_SHAPES + 8)
    # No size asserts after each op in the graph's wrapper (~0.5 ms of a one-sequence SmolLM2
    # step): warm_up checks each kind against the eager layers instead. The sizes that vary
    # are marked before each call through dynamo (MARKS); once dynamo chose a graph for a
    # kind of call, later calls of that kind skip it (engine/model/direct_graph.py).
    return DirectCompiled(KINDS[kind], {"size_asserts": False}, MARKS[kind])


def _decode_graph(
    layers: list[LlamaDecoderLayer], x: torch.Tensor, cos_sin: torch.Tensor,
    ks: list[torch.Tensor], vs: list[torch.Tensor], slots: torch.Tensor, tables: torch.Tensor,
    mask: torch.Tensor, scales: list[tuple[torch.Tensor, torch.Tensor]] | None,
) -> torch.Tensor:  # fmt: skip
    """`_layers_decode` compiled. What its guards would check, the direct call's key holds:
    the layers (the first one, and how many), the dtypes, the caches' shape and whether they
    are fp8 with scales; the step's tensors must be contiguous (their sizes are dynamic),
    else the call goes through dynamo."""
    step_tensors = (x, cos_sin, slots, tables, mask)
    key = None
    if all(t.is_contiguous() for t in step_tensors):
        dtypes = tuple(t.dtype for t in (*step_tensors, ks[0], vs[0]))
        key = (len(layers), dtypes, tuple(ks[0].shape), scales is None)
    return _compiled("decode")(
        layers[0], key, layers, x, cos_sin, ks, vs, slots, tables, mask, scales
    )


def _step_graph(layer: LlamaDecoderLayer, x: torch.Tensor, cos_sin: torch.Tensor) -> torch.Tensor:
    """`_layer_step` compiled (keyed as `_decode_graph`; the cache is read by the op)."""
    key = (x.dtype, cos_sin.dtype) if x.is_contiguous() and cos_sin.is_contiguous() else None
    return _compiled("step")(layer, key, layer, x, cos_sin)


_compiled_shapes: set[tuple] = set()


def _mark_decode(
    layers: list[LlamaDecoderLayer], x: torch.Tensor, cos_sin: torch.Tensor,
    ks: list[torch.Tensor], vs: list[torch.Tensor], slots: torch.Tensor, tables: torch.Tensor,
    mask: torch.Tensor, scales: list[tuple[torch.Tensor, torch.Tensor]] | None = None,
) -> None:  # fmt: skip
    for t in (x, cos_sin, slots, tables, mask):
        torch._dynamo.decorators.mark_unbacked(t, 0)  # sequences
    torch._dynamo.decorators.mark_unbacked(tables, 1)  # blocks per sequence
    torch._dynamo.decorators.mark_unbacked(mask, 1)
    for cache in ks + vs:
        torch._dynamo.maybe_mark_dynamic(cache, 1)  # pool size


def _mark_step(layer: LlamaDecoderLayer, x: torch.Tensor, cos_sin: torch.Tensor) -> None:
    for t in (x, cos_sin):
        torch._dynamo.decorators.mark_unbacked(t, 0)  # tokens


MARKS = {"decode": _mark_decode, "step": _mark_step}


def decode_forward(
    model: LlamaForCausalLM,
    input_ids: torch.Tensor,  # [B]
    positions: torch.Tensor,  # [B]
    kv_caches: list[KVCache],
    slots: torch.Tensor,  # [B]
    block_tables: torch.Tensor,  # [B, nb]
    mask: torch.Tensor,  # [B, nb * block_size] bool
    num_layers: int | None = None,
) -> torch.Tensor:
    """The model's forward for one token of each of B sequences, [B, hidden]; `num_layers`:
    the first ones only."""
    x, cos_sin = model.embed(input_ids, positions)
    ks, vs = [c.k for c in kv_caches], [c.v for c in kv_caches]
    scales = _scales(kv_caches)
    layers = list(model.layers)  # (slicing the ModuleList builds a module: ~0.5 ms a step)
    for g in _groups(num_layers or len(layers)):
        x = _decode_graph(
            layers[g], x, cos_sin, ks[g], vs[g], slots, block_tables, mask, scales and scales[g]
        )
    return model.norm(x)


def _scales(caches: list[KVCache]) -> list[tuple[torch.Tensor, torch.Tensor]] | None:
    """An fp8 cache's (K, V) scales per layer; None for a cache stored as it is computed."""
    if caches[0].k_scale is None:
        return None
    return [(c.k_scale, c.v_scale) for c in caches]  # type: ignore[misc]


def step_forward(
    model: LlamaForCausalLM,
    input_ids: torch.Tensor,  # [T]
    positions: torch.Tensor,  # [T]
    kv_caches: list[KVCache],
    meta: AttentionMetadata,
    num_layers: int | None = None,
) -> torch.Tensor:
    """The model's forward for any step, [T, hidden] (as LlamaForCausalLM.forward)."""
    x, cos_sin = model.embed(input_ids, positions)
    step = _Step(kv_caches, meta)
    _current.append(step)
    n = num_layers or len(model.layers)
    try:
        for layer in model.layers[:n]:
            x = _step_graph(layer, x, cos_sin)
    finally:
        _current.pop()
    if step.layer != n:  # an op left out or run twice: the cache is wrong
        raise RuntimeError(f"{step.layer} attention calls for {n} layers")
    return model.norm(x)


def supported(model: LlamaForCausalLM, kv_cache: KVCache) -> bool:
    """Plain or packed (engine/ops/cpu_linear.py; fp8 weights too, as the kernel's blocks)
    linears, and a cache stored as computed or in fp8 with the kernel to read it (float32
    model, heads of 64 or 128): Fp8Linear's upcast (no kernel here) and an fp8 cache without
    the kernel take the eager path, whose dequantization this graph does not have."""
    from engine.ops.cpu_linear import PackedLinear

    linears = (getattr(parent, name) for parent, name in model._layer_linears())
    plain = all(isinstance(m, torch.nn.Linear | PackedLinear) for m in linears)
    if kv_cache.k_scale is not None:
        plain = plain and fp8_kernel_fits(model.embed_tokens.weight.dtype, kv_cache.k)
    return plain and kv_cache.k.device.type == "cpu"


def _check(kind: str, got: torch.Tensor, want: torch.Tensor, cache_dtype: torch.dtype) -> None:
    """Within a few roundings of the model's dtype, and of the cache's: a bf16 cache under a
    float32 model put the compiled decode 2e-4 (relative) from the eager one (cause not
    traced; tests/engine/test_fp8.py's budget test, run alone, refused to start on it). An fp8
    cache's allowance is bf16's: both sides read the same e4m3 values, and a value the write
    rounds the other way moves the output less than that."""
    cache_eps = min(torch.finfo(cache_dtype).eps, torch.finfo(torch.bfloat16).eps)
    tol = max(1e-4, 8 * torch.finfo(want.dtype).eps, 2 * cache_eps)
    scale = want.float().abs().max().item()
    err = (got.float() - want.float()).abs().max().item()
    if err > tol * max(scale, 1.0):
        raise RuntimeError(
            f"the compiled {kind} forward disagrees with the eager one: max error {err:.3g} "
            f"on values up to {scale:.3g} (allowed {tol:.3g} relative)"
        )


def warm_up(
    model: LlamaForCausalLM,
    kv_cache: KVCache,
    step_case: Callable[[], tuple[torch.Tensor, torch.Tensor, AttentionMetadata]],
) -> bool:
    """Compile both kinds for this model and cache now, on scratch caches of 4 blocks a
    layer, and check them against the eager layers: decodes of one sequence and of two, over
    two blocks and over one, through each length of decode graph the layers split into, and
    `step_case()`'s step (input ids, positions, metadata over those 4 blocks) through the
    first layer. False, and eager from then on for every model, if compiling fails; a compiled
    kind that disagrees raises."""
    if not _state["enabled"] or not supported(model, kv_cache):
        return False
    cpu_kernels.available()  # decode attention's kernel, if the linears did not build it
    p = model.embed_tokens.weight
    heads, _, block_size, head_dim = kv_cache.k.shape
    key = (type(model).__name__, tuple(p.shape), len(model.layers), heads, block_size,
           head_dim, p.dtype, kv_cache.k.dtype, str(p.device))  # fmt: skip
    if key not in _compiled_shapes and len(_compiled_shapes) >= MAX_SHAPES:
        return False
    gen = torch.Generator().manual_seed(0)
    scratch = (heads, 4, block_size, head_dim)  # 4 blocks

    def caches(n: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        return tuple(
            [torch.randn(scratch, generator=gen).to(kv_cache.k.dtype) for _ in range(n)]
            for _ in "kv"
        )

    with torch.inference_mode():
        try:
            for size in sorted({g.stop - g.start for g in _groups(len(model.layers))}):
                layers, (ks, vs) = list(model.layers[:size]), caches(size)
                for b, nb in ((1, 2), (2, 2), (2, 1)):  # sequences, blocks per sequence
                    x = torch.randn(b, p.shape[1], generator=gen).to(p.dtype)
                    positions = torch.tensor([block_size, 2 * block_size - 1])[:b] % (
                        nb * block_size
                    )
                    cos_sin = model.cos_sin[positions]
                    tables = torch.tensor([[0, 1], [3, 2]])[:b, :nb]
                    slots = tables[torch.arange(b), positions // block_size] * block_size
                    slots += positions % block_size
                    mask = torch.arange(nb * block_size)[None] < positions[:, None] + 1
                    args = (slots, tables, mask, _layer_scales(kv_cache, size))
                    want = _layers_decode(layers, x, cos_sin, _clone(ks), _clone(vs), *args)
                    for _ in range(2):  # through dynamo, then directly (calls with a key)
                        got = _decode_graph(layers, x, cos_sin, _clone(ks), _clone(vs), *args)
                        _check("decode", got, want, kv_cache.k.dtype)
            ids, positions, meta = step_case()
            layer, (ks, vs) = model.layers[0], caches(1)
            x = torch.randn(len(ids), p.shape[1], generator=gen).to(p.dtype)
            cos_sin = model.cos_sin[positions]
            scales = (kv_cache.k_scale, kv_cache.v_scale)
            want = layer(x, cos_sin, KVCache(ks[0].clone(), vs[0].clone(), *scales), meta)
            for _ in range(2):
                _current.append(_Step([KVCache(ks[0].clone(), vs[0].clone(), *scales)], meta))
                try:
                    got = _step_graph(layer, x, cos_sin)
                finally:
                    _current.pop()
                _check("step", got, want, kv_cache.k.dtype)
        except RuntimeError as e:
            if "disagrees" in str(e):
                raise
            return _unavailable(e)
        except Exception as e:  # inductor needs a working C++ toolchain
            return _unavailable(e)
    _compiled_shapes.add(key)
    return True


def _clone(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """Copies made as the runner's caches are: outside inference mode. Dynamo guards each
    tensor's dispatch keys, which differ between inference tensors and others, so warming up
    on inference tensors left the first real decode step to compile again (~2-9 s)."""
    with torch.inference_mode(False):
        return [t.clone() for t in tensors]


def _layer_scales(cache: KVCache, n: int) -> list[tuple[torch.Tensor, torch.Tensor]] | None:
    """An fp8 cache's scales for n scratch layers: a pair of its own for each, made as the
    cache's were (in inference mode or not). Passing one pair n times, dynamo would take it
    as one input and guard that the layers share it: the runner's layers, each with scales of
    its own, would compile again mid-run."""
    if cache.k_scale is None or cache.v_scale is None:
        return None
    with torch.inference_mode(cache.k_scale.is_inference()):
        return [(cache.k_scale.clone(), cache.v_scale.clone()) for _ in range(n)]


def _unavailable(e: Exception) -> bool:
    logger.warning("compiled forward unavailable, staying eager: %s", e)
    _state["enabled"] = False
    return False
