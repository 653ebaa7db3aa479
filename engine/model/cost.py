"""FLOPs and bytes moved by one engine step, from the model's shape and what the step
computed: how achieved FLOP/s and bytes/s (model FLOPs and bandwidth utilization, against a
measured device peak) are counted in the step log, `bench report` and `bench profile`.

The usual accounting (PaLM's MFU appendix, kipply's "Transformer inference arithmetic"): a
token costs 2 FLOPs per linear weight; attention 4 x heads x head_dim FLOPs per (query, key)
pair a layer (QK^T and PV); a step reads every linear weight once, the LM head's if any row
is sampled, each request's whole KV context once, and writes the new tokens' K and V.
Activations, norms and embedding lookups are left out."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from engine.config import ModelConfig


def matmul_params(cfg: ModelConfig) -> int:
    """Weights of the transformer's linears (Q, K, V, O, gate, up, down): every token
    multiplies by each once. Embeddings, norms and the LM head are not counted."""
    q = cfg.num_heads * cfg.head_dim
    kv = cfg.num_kv_heads * cfg.head_dim
    attn = cfg.hidden_size * (q + 2 * kv) + q * cfg.hidden_size
    return cfg.num_layers * (attn + 3 * cfg.hidden_size * cfg.intermediate_size)


def kv_bytes_per_token(cfg: ModelConfig, bytes_per_elem: float) -> float:
    """K and V of one token over all layers."""
    return 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * bytes_per_elem


@dataclass(frozen=True, slots=True)
class StepCost:
    flops: float
    weight_bytes: float
    kv_read_bytes: float
    kv_write_bytes: float

    @property
    def bytes(self) -> float:
        return self.weight_bytes + self.kv_read_bytes + self.kv_write_bytes


def step_cost(
    cfg: ModelConfig,
    chunks: Sequence[tuple[int, int]],
    sampled_rows: int,
    weight_bytes_per_param: float,
    kv_bytes_per_elem: float,
    head_bytes_per_param: float | None = None,
) -> StepCost:
    """chunks: (tokens cached before the step, tokens computed in it) of each request; a
    decode is (context, 1). Query i of a chunk starting at s sees s + i + 1 keys, so prefill
    attention is counted exactly, not as if every query read the whole context.
    sampled_rows: rows through the LM head. head_bytes_per_param defaults to the weights'
    (the engine's fp8 keeps the LM head in the model dtype)."""
    return step_cost_of_totals(
        cfg, *chunk_totals(chunks), sampled_rows, weight_bytes_per_param, kv_bytes_per_elem,
        head_bytes_per_param,
    )  # fmt: skip


def chunk_totals(chunks: Sequence[tuple[int, int]]) -> tuple[int, int, int]:
    """Tokens computed, (query, key) pairs attended and keys read (s + n) by the chunks."""
    tokens = sum(n for _, n in chunks)
    pairs = sum(n * s + n * (n + 1) // 2 for s, n in chunks)
    return tokens, pairs, sum(s + n for s, n in chunks)


def step_cost_of_totals(
    cfg: ModelConfig,
    tokens: int,
    pairs: int,
    keys: int,
    sampled_rows: int,
    weight_bytes_per_param: float,
    kv_bytes_per_elem: float,
    head_bytes_per_param: float | None = None,
) -> StepCost:
    """`step_cost` from the chunks' sums: tokens computed, (query, key) pairs attended and
    keys read (each chunk's s + n). The simulation sums hundreds of decodes incrementally."""
    head_bytes = weight_bytes_per_param if head_bytes_per_param is None else head_bytes_per_param
    params = matmul_params(cfg)
    head = cfg.hidden_size * cfg.vocab_size
    kv_token = kv_bytes_per_token(cfg, kv_bytes_per_elem)
    return StepCost(
        flops=2.0 * params * tokens
        + 2.0 * head * sampled_rows
        + 4.0 * cfg.num_layers * cfg.num_heads * cfg.head_dim * pairs,
        weight_bytes=params * weight_bytes_per_param + (head * head_bytes if sampled_rows else 0),
        kv_read_bytes=kv_token * keys,
        kv_write_bytes=kv_token * tokens,
    )


@dataclass(frozen=True, slots=True)
class StepShape:
    """What a step computes, in the terms its time depends on: the step log's fields, the
    features a calibrated step-time model is fitted on, and what a simulated step costs."""

    prefill_tokens: int  # tokens of prompt chunks (and recomputes) this step
    decode_tokens: int  # tokens of decodes (one each, more with speculative drafts)
    seqs: int
    context_tokens: int  # keys the attention reads, summed over requests (their KV)
    decode_context_tokens: int  # of those, the decodes' (read once per decode: bandwidth)
    prefill_attention_pairs: int  # (query, key) pairs of the prefill chunks (compute)
    sampled_rows: int  # rows through the LM head

    @property
    def tokens(self) -> int:
        return self.prefill_tokens + self.decode_tokens

    def as_dict(self) -> dict[str, int]:
        return {f: getattr(self, f) for f in self.__slots__}  # type: ignore[attr-defined]


def step_shape(chunks: Sequence[tuple[int, int, bool, int]]) -> StepShape:
    """chunks: (tokens cached before, tokens computed, is a decode, rows it samples: 0, or 1
    plus its drafts) per request."""
    prefill = decode = context = decode_context = pairs = rows = 0
    for s, n, is_decode, samples in chunks:
        context += s + n
        rows += samples
        if is_decode:
            decode += n
            decode_context += s + n
        else:
            prefill += n
            pairs += n * s + n * (n + 1) // 2
    return StepShape(prefill, decode, len(chunks), context, decode_context, pairs, rows)
