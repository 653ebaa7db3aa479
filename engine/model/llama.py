"""The Llama architecture (SmolLM2, TinyLlama, Llama-3 shapes) over a paged KV cache.

Tokens of all requests in a step are one flat batch [T]; where each token's K/V goes and
what it attends to comes from `AttentionMetadata`. Q/K/V and gate/up projections are fused
into one matmul each."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

import torch
from torch import nn

from engine.config import ModelConfig
from engine.ops import (
    AttentionMetadata,
    KVCache,
    apply_rotary,
    cpu_kernels,
    paged_attention,
    rms_norm,
    rotary_cos_sin,
    silu_and_mul,
    write_kv_cache,
)
from engine.ops.cpu_decode_attention import paged_decode_attention
from engine.ops.cpu_linear import PackedLinear
from engine.ops.fp8 import Fp8Linear

if TYPE_CHECKING:
    from engine.distributed.group import TPGroup


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)


def no_reduce(x: torch.Tensor) -> torch.Tensor:
    """A row-parallel linear's all-reduce without tensor parallelism (see engine/distributed)."""
    return x


class PagedAttention(nn.Module):
    """Writes a step's new K/V into the paged cache and attends over it: the part of a layer
    that reads the KV cache (a module so that a profiler can time it as one)."""

    def __init__(self, scale: float) -> None:
        super().__init__()
        self.scale = scale

    def forward(
        self,
        q: torch.Tensor,  # [T, heads, head_dim]
        k: torch.Tensor,  # [T, kv_heads, head_dim]
        v: torch.Tensor,
        kv_cache: KVCache,
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        write_kv_cache(k, v, kv_cache, meta.slot_mapping)
        return paged_attention(q, kv_cache, meta, self.scale)  # [T, heads, head_dim]


class LlamaAttention(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = (
            cfg.num_heads,
            cfg.num_kv_heads,
            cfg.head_dim,
        )
        self.q_size = cfg.num_heads * cfg.head_dim
        self.kv_size = cfg.num_kv_heads * cfg.head_dim
        self.attn = PagedAttention(cfg.head_dim**-0.5)
        self.qkv_proj = nn.Linear(cfg.hidden_size, self.q_size + 2 * self.kv_size, bias=False)
        self.o_proj = nn.Linear(self.q_size, cfg.hidden_size, bias=False)
        self.reduce = no_reduce  # after o_proj: the sum over ranks under tensor parallelism

    def project(
        self, x: torch.Tensor, cos_sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Q [T, heads, head_dim] and K, V [T, kv_heads, head_dim], rotary applied."""
        t = x.shape[0]
        q, k, v = self.qkv_proj(x).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = apply_rotary(q.view(t, self.num_heads, self.head_dim), cos_sin)
        k = apply_rotary(k.view(t, self.num_kv_heads, self.head_dim), cos_sin)
        return q, k, v.view(t, self.num_kv_heads, self.head_dim)


class LlamaMLP(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.gate_up_proj = nn.Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)
        self.reduce = no_reduce  # after down_proj, as the attention's

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.reduce(self.down_proj(silu_and_mul(self.gate_up_proj(x))))


class LlamaDecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = LlamaAttention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = LlamaMLP(cfg)

    # A layer is: attention inputs (norm, QKV, rotary), attention over the paged cache, and
    # the rest (O, residual, norm, MLP, residual). The eager forward and the two compiled ones
    # (engine/model/compiled_forward.py) differ only in how they attend.

    def attention_inputs(
        self, x: torch.Tensor, cos_sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.self_attn.project(self.input_layernorm(x), cos_sin)

    def attention_output(self, x: torch.Tensor, o: torch.Tensor) -> torch.Tensor:
        """x: the layer's input [T, hidden]; o: attention's output [T, heads, head_dim]."""
        attn = self.self_attn
        x = x + attn.reduce(attn.o_proj(o.reshape(x.shape[0], attn.q_size)))
        return x + self.mlp(self.post_attention_layernorm(x))

    def forward(
        self, x: torch.Tensor, cos_sin: torch.Tensor, kv_cache: KVCache, meta: AttentionMetadata
    ) -> torch.Tensor:
        q, k, v = self.attention_inputs(x, cos_sin)
        return self.attention_output(x, self.self_attn.attn(q, k, v, kv_cache, meta))

    def decode(
        self,
        x: torch.Tensor,  # [B, hidden]: one token of each sequence
        cos_sin: torch.Tensor,  # [B, 2, head_dim]
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        slots: torch.Tensor,  # [B]
        block_tables: torch.Tensor,  # [B, nb]
        mask: torch.Tensor,  # [B, nb * block_size] bool
        k_scale: torch.Tensor | None = None,  # an fp8 cache's scales, [kv_heads, 1, 1]
        v_scale: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """`forward` for a step of decodes only, with the attention formula of
        ops/cpu_decode_attention.py and no metadata branches: what the compiled decode forward
        compiles into one graph (engine/model/compiled_forward.py)."""
        q, k, v = self.attention_inputs(x, cos_sin)
        write_kv_cache(k, v, KVCache(k_cache, v_cache, k_scale, v_scale), slots)
        b, kv_heads, head_dim = k.shape
        q = q.view(b, kv_heads, -1, head_dim)
        scale = self.self_attn.attn.scale
        o = paged_decode_attention(
            q, k_cache, v_cache, block_tables, mask, scale, k_scale=k_scale, v_scale=v_scale
        )
        return self.attention_output(x, o)


class LlamaForCausalLM(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.config = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(LlamaDecoderLayer(cfg) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        self.cos_sin: torch.Tensor | None = None  # built by `prepare`, once dtype/device are final
        # Tensor parallelism (engine/distributed): this rank's first vocabulary row, and the
        # group whose ranks hold the other rows (the embedding lookup sums over them).
        self.vocab_start = 0
        self.tp: TPGroup | None = None

    def prepare(self, max_positions: int) -> None:
        if self.cos_sin is not None and self.cos_sin.shape[0] >= max_positions:
            return  # engines sharing this model may ask for different context lengths
        p = self.embed_tokens.weight
        self.cos_sin = rotary_cos_sin(
            self.config.head_dim, max_positions, self.config.rope_theta, p.dtype, p.device
        )

    def embed(
        self, input_ids: torch.Tensor, positions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The first layer's input [T, hidden] and the rotary rows of the positions [T, 2,
        head_dim]: what every forward (eager, compiled, Triton) starts from."""
        assert self.cos_sin is not None, "call prepare() first"
        if self.tp is not None:
            x = self.tp.embed(self.embed_tokens.weight, input_ids, self.vocab_start)
            return x, self.cos_sin[positions]
        return self.embed_tokens(input_ids), self.cos_sin[positions]

    def forward(
        self,
        input_ids: torch.Tensor,  # [T]
        positions: torch.Tensor,  # [T]
        kv_caches: list[KVCache],
        meta: AttentionMetadata,
        num_layers: int | None = None,
    ) -> torch.Tensor:
        """[T, hidden] after the final norm; `num_layers`: only the first ones (an early-exit
        draft: engine/spec_decode/draft_layers.py)."""
        x, cos_sin = self.embed(input_ids, positions)
        n = num_layers or len(self.layers)
        for layer, kv_cache in zip(self.layers[:n], kv_caches[:n], strict=True):
            x = layer(x, cos_sin, kv_cache, meta)
        return self.norm(x)  # [T, hidden]

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[N, vocab] in the model dtype (the sampler upcasts what it needs)."""
        if isinstance(self.lm_head, PackedLinear):
            return self.lm_head(hidden)
        w = self.lm_head.weight
        cpu, rows = hidden.device.type == "cpu", hidden.shape[0]
        if cpu and rows <= 8 and w.dtype == torch.float32 and cpu_kernels.available():
            return torch.ops.servebench.linear_rows(hidden, w)  # W as it is (cpu_kernels.cpp)
        if cpu and rows <= 64:
            # The same product as W @ h.T, transposed: CPU BLAS streams the 49k-row vocabulary
            # matrix faster this way at few rows (docs/results/2026-12-04-cpu-design-choices.md).
            return (w @ hidden.t()).t()
        return self.lm_head(hidden)

    def _layer_linears(self) -> Iterator[tuple[nn.Module, str]]:
        for layer in self.layers:
            yield layer.self_attn, "qkv_proj"
            yield layer.self_attn, "o_proj"
            yield layer.mlp, "gate_up_proj"
            yield layer.mlp, "down_proj"

    def quantize_fp8(self) -> None:
        """Linear weights of every layer to e4m3 with per-channel scales, in place. Embeddings,
        norms and the LM head stay in the model dtype (as in vLLM's fp8 checkpoints)."""
        for parent, name in self._layer_linears():
            setattr(parent, name, Fp8Linear.from_linear(getattr(parent, name)))

    def pack_for_cpu(self, tied_head: bool = True) -> None:
        """Every float linear to its CPU layout (the engine's kernel's, or oneDNN's), and every
        fp8 one to the kernel's where it is built (a quarter of float32's bytes to read), in
        place; see engine/ops/cpu_linear.py. A tied LM head gets its own packed copy (the
        embedding lookup needs the plain matrix): 108 MiB more on SmolLM2 for a decode step
        135 -> 120 ms at 32 sequences; `tied_head=False` keeps memory instead. A bf16 model's
        linears become bf16 blocks (where the kernel runs: model_store checks); its fp8 ones
        stay as they are (the fp8 kernel takes float32 activations)."""
        dtype = self.embed_tokens.weight.dtype
        fp8_kernel = dtype == torch.float32 and cpu_kernels.available()
        for parent, name in self._layer_linears():
            linear = getattr(parent, name)
            if isinstance(linear, nn.Linear):
                setattr(parent, name, PackedLinear.from_linear(linear))
            elif isinstance(linear, Fp8Linear) and fp8_kernel:
                setattr(parent, name, PackedLinear.from_fp8(linear))
        tied = self.config.tie_word_embeddings
        if isinstance(self.lm_head, nn.Linear) and (tied_head or not tied):
            self.lm_head = PackedLinear.from_linear(self.lm_head)

    def weight_bytes(self, as_dtype: torch.dtype | None = None) -> int:
        """Bytes of the weights as held (a tied embedding once, plus the LM head's packed copy
        if any), or as the checkpoint's weights would be in `as_dtype` (fp8 scales and packed
        copies left out): what quantization saves."""
        named = dict(self.named_parameters()) | dict(self.named_buffers())
        if as_dtype is None:
            return sum(t.numel() * t.element_size() for t in named.values())
        size = torch.empty((), dtype=as_dtype).element_size()
        skip = ("weight_scale",)
        if self.config.tie_word_embeddings:
            skip += ("lm_head.packed_weight",)  # a copy of the embedding
        return sum(t.numel() * size for n, t in named.items() if not n.endswith(skip))

    def load_hf_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy tensors named as in a Hugging Face Llama checkpoint into the fused layout."""
        cfg = self.config
        params = dict(self.named_parameters())
        fused = {
            "q_proj": ("qkv_proj", 0, cfg.num_heads * cfg.head_dim),
            "k_proj": ("qkv_proj", cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim),
            "v_proj": (
                "qkv_proj",
                (cfg.num_heads + cfg.num_kv_heads) * cfg.head_dim,
                cfg.num_kv_heads * cfg.head_dim,
            ),
            "gate_proj": ("gate_up_proj", 0, cfg.intermediate_size),
            "up_proj": ("gate_up_proj", cfg.intermediate_size, cfg.intermediate_size),
        }
        pieces_loaded: Counter[str] = Counter()
        for hf_name, tensor in weights:
            name = hf_name.removeprefix("model.")
            if "rotary_emb" in name or (name == "lm_head.weight" and cfg.tie_word_embeddings):
                continue
            *prefix, target, kind = name.split(".")
            if target in fused:
                fused_name, start, size = fused[target]
                pname = ".".join([*prefix, fused_name, kind])
                dst = params[pname].data[start : start + size]
            elif name in params:
                pname, dst = name, params[name].data
            else:
                raise KeyError(f"checkpoint tensor {hf_name!r} has no place in the model")
            if tuple(dst.shape) != tuple(tensor.shape):
                raise ValueError(
                    f"{hf_name}: checkpoint shape {tuple(tensor.shape)} != model {tuple(dst.shape)}"
                )
            dst.copy_(tensor)
            pieces_loaded[pname] += 1
        pieces = {"qkv_proj": 3, "gate_up_proj": 2}
        missing = [p for p in params if pieces_loaded[p] != pieces.get(p.split(".")[-2], 1)]
        if missing:
            raise ValueError(
                f"checkpoint lacks tensors for {len(missing)} weights, e.g. {missing[:3]}"
            )
