"""Which part of the model a rank holds, and the slicing that leaves it only that part.

Heads are split by KV head so that each rank's query heads attend to KV heads it holds:
KV heads as evenly as possible with their query groups (SmolLM2's 3 KV heads over 2 ranks:
2 and 1, so 6 and 3 query heads: uneven splits are allowed, unlike vLLM); with fewer KV
heads than ranks, query heads split evenly and each rank holds a copy of the one KV head
its queries use (vLLM's replication). The MLP's intermediate dimension and the vocabulary
split as evenly as possible."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
from torch import nn

from engine.config import ModelConfig


def _split(n: int, size: int, rank: int) -> range:
    """Rank's part of range(n) cut into `size` contiguous parts as even as possible."""
    base, extra = divmod(n, size)
    start = rank * base + min(rank, extra)
    return range(start, start + base + (rank < extra))


def vocab_sizes(vocab: int, size: int) -> list[int]:
    """Each rank's number of vocabulary rows, in rank order."""
    return [len(_split(vocab, size, r)) for r in range(size)]


@dataclass(frozen=True, slots=True)
class Shard:
    rank: int
    size: int
    q_heads: range
    kv_heads: range
    intermediate: range
    vocab: range

    @classmethod
    def plan(cls, cfg: ModelConfig, rank: int, size: int) -> Shard:
        check_shardable(cfg, size)
        h, kv = cfg.num_heads, cfg.num_kv_heads
        if kv >= size:
            kv_heads = _split(kv, size, rank)
            group = h // kv
            q_heads = range(kv_heads.start * group, kv_heads.stop * group)
        else:
            q_heads = _split(h, size, rank)
            first = q_heads.start // (h // kv)
            kv_heads = range(first, first + 1)
        inter = _split(cfg.intermediate_size, size, rank)
        return cls(rank, size, q_heads, kv_heads, inter, _split(cfg.vocab_size, size, rank))

    def local_config(self, cfg: ModelConfig) -> ModelConfig:
        """The shapes this rank computes with: its heads and MLP slice (its KV cache's
        shape); the vocabulary stays the model's."""
        return dataclasses.replace(
            cfg,
            num_heads=len(self.q_heads),
            num_kv_heads=len(self.kv_heads),
            intermediate_size=len(self.intermediate),
        )


def check_shardable(cfg: ModelConfig, size: int) -> None:
    h, kv = cfg.num_heads, cfg.num_kv_heads
    if size < 1:
        raise ValueError(f"tensor_parallel_size must be >= 1, got {size}")
    if kv >= size:
        return
    if size % kv or h % size:
        raise ValueError(
            f"tensor_parallel_size={size} does not fit {h} query / {kv} KV heads: with fewer "
            "KV heads than ranks, the ranks must be a multiple of the KV heads and divide the "
            "query heads"
        )


def _linear(weight: torch.Tensor) -> nn.Linear:
    out = nn.Linear(weight.shape[1], weight.shape[0], bias=False, device=weight.device)
    out.weight = nn.Parameter(weight.contiguous(), requires_grad=False)
    return out


@torch.no_grad()
def shard_model(model: nn.Module, shard: Shard) -> None:
    """Keep only this rank's rows and columns of every weight, in place (plain float
    linears: before fp8 quantization or CPU packing)."""
    cfg = model.config
    hd = cfg.head_dim

    def index(r: range) -> torch.Tensor:
        return torch.arange(r.start, r.stop, device=model.embed_tokens.weight.device)

    q_rows = index(range(shard.q_heads.start * hd, shard.q_heads.stop * hd))
    kv_rows = index(range(shard.kv_heads.start * hd, shard.kv_heads.stop * hd))
    q_size, kv_size = cfg.num_heads * hd, cfg.num_kv_heads * hd
    qkv_rows = torch.cat([q_rows, q_size + kv_rows, q_size + kv_size + kv_rows])
    inter = index(shard.intermediate)
    gate_up_rows = torch.cat([inter, cfg.intermediate_size + inter])
    for layer in model.layers:
        attn, mlp = layer.self_attn, layer.mlp
        attn.qkv_proj = _linear(attn.qkv_proj.weight[qkv_rows])
        attn.o_proj = _linear(attn.o_proj.weight[:, q_rows])
        attn.num_heads, attn.num_kv_heads = len(shard.q_heads), len(shard.kv_heads)
        attn.q_size, attn.kv_size = attn.num_heads * hd, attn.num_kv_heads * hd
        mlp.gate_up_proj = _linear(mlp.gate_up_proj.weight[gate_up_rows])
        mlp.down_proj = _linear(mlp.down_proj.weight[:, inter])
    vocab = slice(shard.vocab.start, shard.vocab.stop)
    embed = model.embed_tokens
    embed.weight = nn.Parameter(embed.weight[vocab].clone(), requires_grad=False)
    if cfg.tie_word_embeddings:
        model.lm_head = _linear(embed.weight)
        model.lm_head.weight = embed.weight
    else:
        model.lm_head = _linear(model.lm_head.weight[vocab].clone())  # not a view: frees the rest
    model.vocab_start = shard.vocab.start
