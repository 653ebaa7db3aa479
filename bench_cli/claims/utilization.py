"""Claim 6, "Fused kernels raise compute utilization from 30 % to over 65 % of peak FLOPS":
achieved FLOP/s and bytes/s of each engine step (a run folder's steps.jsonl) against the peak
of this device, measured (MFU: model FLOPs utilization; MBU: model bandwidth utilization)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from engine.config import ModelConfig
from engine.model.cost import matmul_params


def step_cost(
    cfg: ModelConfig,
    tokens: int,
    context_tokens: int,
    weight_bytes_per_param: float,
    kv_bytes_per_elem: float,
    sampled_rows: int = 1,
    head_bytes_per_param: float | None = None,
) -> tuple[float, float]:
    """Approximate (FLOPs, bytes moved) of one engine step from its totals alone, for step logs
    older than the engine's own exact count (engine/model/cost.py): the usual accounting of the
    PaLM paper's MFU appendix (6N per trained token, 2N per inferred one, plus attention) and
    kipply's "Transformer inference arithmetic" (a step reads every weight once, and the KV it
    attends to):

    FLOPs = 2 x matmul_params x tokens + 2 x hidden x vocab x sampled_rows (LM head)
            + 4 x layers x heads x head_dim x context_tokens (QK^T and PV, 2 FLOPs a MAC each)
    bytes = matmul_params x weight_bytes_per_param + vocab x hidden x head_bytes_per_param (if any
            row is sampled) + KV bytes/token x (context_tokens read + tokens written)

    `tokens`: tokens computed in the step (prefill + decode); `context_tokens`: the sum over the
    step's requests of the KV length attention reads. The attention term is exact for decodes
    (one query per request); for a prefill chunk of n tokens each query reads its own prefix, so
    the true count is up to n times more: prefill attention FLOPs here are a lower bound.
    `sampled_rows`: rows through the LM head (the engine samples one per request that reaches
    its last computed token; callers without that count pass the number of sequences, an upper
    bound). `head_bytes_per_param` (default: `weight_bytes_per_param`): the engine's fp8 keeps
    the LM head in the model dtype. Activations, norms and embedding lookups are left out."""
    head_bytes = weight_bytes_per_param if head_bytes_per_param is None else head_bytes_per_param
    params = matmul_params(cfg)
    head = cfg.hidden_size * cfg.vocab_size
    flops = (
        2.0 * params * tokens
        + 2.0 * head * sampled_rows
        + 4.0 * cfg.num_layers * cfg.num_heads * cfg.head_dim * context_tokens
    )
    kv_token_bytes = 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * kv_bytes_per_elem
    moved = (
        params * weight_bytes_per_param
        + (head * head_bytes if sampled_rows else 0.0)
        + kv_token_bytes * (context_tokens + tokens)
    )
    return flops, moved


def _summary(rows: list[tuple[float, float, float]], peak: dict[str, Any]) -> dict[str, float]:
    """rows: (dur_s, flops, bytes) per step; time-weighted rates = totals / total time."""
    time_s = sum(r[0] for r in rows)
    flops = sum(r[1] for r in rows)
    moved = sum(r[2] for r in rows)
    mfu = sorted(r[1] / r[0] / peak["peak_flops"] for r in rows)
    flops_per_s = flops / time_s if time_s > 0 else math.nan
    bytes_per_s = moved / time_s if time_s > 0 else math.nan
    return {
        "steps": len(rows),
        "time_s": time_s,
        "flops": flops,
        "bytes": moved,
        "flops_per_s": flops_per_s,
        "bytes_per_s": bytes_per_s,
        "mfu": flops_per_s / peak["peak_flops"],
        "mbu": bytes_per_s / peak["peak_bytes_per_s"],
        "mfu_mean": sum(mfu) / len(mfu) if mfu else math.nan,
        "mfu_p50": float(np.percentile(mfu, 50)) if mfu else math.nan,
        "mfu_p90": float(np.percentile(mfu, 90)) if mfu else math.nan,
    }


def utilization(
    steps: list[dict[str, Any]],
    cfg: ModelConfig,
    peak: dict[str, Any],
    weight_bytes_per_param: float,
    kv_bytes_per_elem: float,
    skip_first: int = 5,
    block_size: int = 16,
    head_bytes_per_param: float | None = None,
) -> dict[str, Any]:
    """Achieved FLOP/s and bytes/s of engine steps (steps.jsonl's lines, as
    bench_cli.claims.evidence.read_steps gives them), against
    `peak` (measure_peak's dict): time-weighted over steps (total FLOPs / total step time), so
    long steps count for their time; MFU = FLOP/s / peak_flops, MBU = bytes/s / peak_bytes_per_s;
    mean, p50 and p90 of per-step MFU. Keys "all", "decode" (steps with no prefill token) and
    "prefill" (steps with any), each as _summary gives, plus how the context was counted.

    The first `skip_first` steps with work are left out: the first steps of a run pay for
    torch.compile, allocation and cold caches. Steps with no token or no duration are left out.
    Steps that carry the engine's own count ("flops", "weight_bytes", "kv_read_bytes",
    "kv_write_bytes": exact per request) use it; older step logs are approximated as below.
    Without a step's `context_tokens`, it is approximated by kv_blocks_used x block_size: every
    block held then (running requests, and cached blocks still counted as used), whole blocks,
    so an upper bound on what attention reads. Each scheduled sequence is assumed to pass one row
    through the LM head (a prefill chunk that does not end its prompt passes none)."""
    rows: dict[str, list[tuple[float, float, float]]] = {"all": [], "decode": [], "prefill": []}
    approximated = seen = 0
    for step in steps:
        tokens = step.get("prefill_tokens", 0) + step.get("decode_tokens", 0)
        dur = step.get("dur_s", 0.0)
        if tokens <= 0 or dur <= 0:
            continue
        seen += 1
        if seen <= skip_first:
            continue
        if "flops" in step:  # the engine's own count (engine/model/cost.py)
            flops = step["flops"]
            moved = step["weight_bytes"] + step["kv_read_bytes"] + step["kv_write_bytes"]
        else:
            context = step.get("context_tokens")
            if context is None:
                approximated += 1
                context = step.get("kv_blocks_used", 0) * block_size
            flops, moved = step_cost(
                cfg,
                tokens,
                context,
                weight_bytes_per_param,
                kv_bytes_per_elem,
                sampled_rows=step.get("seqs", 1),
                head_bytes_per_param=head_bytes_per_param,
            )
        rows["all"].append((dur, flops, moved))
        rows["prefill" if step.get("prefill_tokens", 0) else "decode"].append((dur, flops, moved))
    out: dict[str, Any] = {kind: _summary(r, peak) for kind, r in rows.items()}
    out["skipped_warmup_steps"] = min(seen, skip_first)
    out["context_approximated_steps"] = approximated
    out["peak_flops"] = float(peak["peak_flops"])
    out["peak_bytes_per_s"] = float(peak["peak_bytes_per_s"])
    return out
