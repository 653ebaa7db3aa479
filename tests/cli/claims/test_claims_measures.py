"""The measures behind `bench claims` 5 (FP8 accuracy) and 6 (compute utilization)."""

import json
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from bench_cli.claims import accuracy
from bench_cli.claims.evidence import read_steps
from bench_cli.claims.utilization import step_cost, utilization
from bench_cli.device_peak import measure_peak
from engine import LLM
from engine.config import ModelConfig
from engine.model.cost import matmul_params

# Random weights behind SmolLM2's tokenizer: real text at tiny-model speed.
TINY = "tiny-smollm2"
FP32 = {"dtype": "float32"}


# ---- accuracy ------------------------------------------------------------------------------


def test_identical_variants_agree_fully() -> None:
    out = accuracy.compare(TINY, {"a": FP32, "b": FP32}, max_tokens=64)
    assert out["a"]["tokens"] == out["b"]["tokens"] == 63
    assert out["b"]["top1_agreement"] == 1.0
    assert out["b"]["mean_kl"] == pytest.approx(0.0, abs=1e-6)
    assert out["b"]["perplexity"] == pytest.approx(out["a"]["perplexity"], rel=1e-6)


def test_fp8_variant_scores_finite_with_agreement_at_most_one() -> None:
    fp8 = {**FP32, "quantization": "fp8", "kv_cache_dtype": "fp8"}
    out = accuracy.compare(TINY, {"fp32": FP32, "fp8": fp8}, max_tokens=64)["fp8"]
    assert 0.0 <= out["top1_agreement"] <= 1.0
    assert math.isfinite(out["perplexity"]) and out["perplexity"] > 1.0
    assert out["mean_kl"] >= -1e-6


def test_perplexity_matches_cross_entropy_of_one_forward() -> None:
    """compare scores in 256-token chunks through the cache; here all 300 tokens go in one."""
    text = accuracy.heldout_text()
    ppl = accuracy.compare(TINY, {"fp32": FP32}, text=text, max_tokens=300)["fp32"]["perplexity"]
    llm = LLM(TINY, enforce_eager=True, **FP32)
    ids = llm.get_tokenizer().encode(text)[:300]
    logits = llm.llm_engine.prompt_logits(ids, chunk_size=len(ids))
    nll = F.cross_entropy(logits[:-1].double(), torch.tensor(ids[1:]))
    assert ppl == pytest.approx(math.exp(nll.item()), rel=1e-4)


def test_heldout_text_is_package_data() -> None:
    assert len(accuracy.heldout_text()) > 1000


# ---- utilization ---------------------------------------------------------------------------

# 2 layers, hidden 8, 2 heads x 4 (1 KV head), FFN 16, vocab 32.
SMALL = ModelConfig(
    vocab_size=32,
    hidden_size=8,
    intermediate_size=16,
    num_layers=2,
    num_heads=2,
    num_kv_heads=1,
    head_dim=4,
)
PEAK = {"peak_flops": 1e9, "peak_bytes_per_s": 1e8}


def test_matmul_params_count_the_linears() -> None:
    # per layer: q 8x8 + k 8x4 + v 8x4 + o 8x8 + 3 x 8x16 = 64 + 32 + 32 + 64 + 384 = 576
    assert matmul_params(SMALL) == 2 * 576


def test_step_cost_by_hand() -> None:
    # 10 tokens, 100 context tokens, 3 sampled rows, 1-byte weights, 2-byte KV
    flops, moved = step_cost(SMALL, 10, 100, 1.0, 2.0, sampled_rows=3)
    # linears 2 x 1152 x 10 + head 2 x 8 x 32 x 3 + attention 4 x 2 x 2 x 4 x 100
    assert flops == 23040 + 1536 + 6400
    # weights 1152 + head 256 + KV (2 x 2 layers x 1 head x 4 x 2 bytes = 32 / token) x 110
    assert moved == 1152 + 256 + 32 * 110


def test_step_cost_head_in_other_dtype_and_no_sampled_row() -> None:
    _, moved = step_cost(SMALL, 10, 100, 1.0, 2.0, sampled_rows=3, head_bytes_per_param=4.0)
    assert moved == 1152 + 4 * 256 + 32 * 110
    flops, moved = step_cost(SMALL, 10, 100, 1.0, 2.0, sampled_rows=0)
    assert (flops, moved) == (23040 + 6400, 1152 + 32 * 110)


def write_steps(path: Path, steps: list[dict]) -> Path:
    path.write_text("".join(json.dumps(s) + "\n" for s in steps))
    return path


def step(dur_s: float, prefill: int, decode: int, seqs: int, **extra: int) -> dict:
    return {
        "t": 0.0,
        "dur_s": dur_s,
        "prefill_tokens": prefill,
        "decode_tokens": decode,
        "seqs": seqs,
        "running": seqs,
        "kv_blocks_used": 4,
        **extra,
    }


def test_utilization_is_time_weighted_over_steps_after_warmup(tmp_path: Path) -> None:
    steps = [
        step(5.0, 64, 0, 1, context_tokens=64),  # warm-up (compile): skipped
        step(0.0, 0, 0, 0),  # idle: not counted, nor as warm-up
        step(0.5, 0, 4, 4, context_tokens=200),
        step(1.5, 30, 2, 3, context_tokens=300),
    ]
    write_steps(tmp_path / "steps.jsonl", steps)
    out = utilization(read_steps(tmp_path), SMALL, PEAK, 1.0, 2.0, 1)
    f_decode, b_decode = step_cost(SMALL, 4, 200, 1.0, 2.0, sampled_rows=4)
    f_prefill, b_prefill = step_cost(SMALL, 32, 300, 1.0, 2.0, sampled_rows=3)
    assert out["skipped_warmup_steps"] == 1 and out["context_approximated_steps"] == 0
    assert out["all"]["steps"] == 2
    assert out["all"]["flops_per_s"] == pytest.approx((f_decode + f_prefill) / 2.0)
    assert out["all"]["bytes_per_s"] == pytest.approx((b_decode + b_prefill) / 2.0)
    assert out["all"]["mfu"] == pytest.approx((f_decode + f_prefill) / 2.0 / 1e9)
    assert out["all"]["mbu"] == pytest.approx((b_decode + b_prefill) / 2.0 / 1e8)
    per_step = sorted([f_decode / 0.5 / 1e9, f_prefill / 1.5 / 1e9])
    assert out["all"]["mfu_mean"] == pytest.approx(sum(per_step) / 2)
    assert out["all"]["mfu_p50"] == pytest.approx(sum(per_step) / 2)
    assert out["all"]["mfu_p90"] == pytest.approx(per_step[0] + 0.9 * (per_step[1] - per_step[0]))
    assert out["decode"]["flops_per_s"] == pytest.approx(f_decode / 0.5)
    assert out["prefill"]["flops_per_s"] == pytest.approx(f_prefill / 1.5)
    json.dumps(out)  # plain values only


def test_utilization_without_context_tokens_uses_blocks_held(tmp_path: Path) -> None:
    write_steps(tmp_path / "steps.jsonl", [step(1.0, 0, 2, 2)])
    out = utilization(read_steps(tmp_path), SMALL, PEAK, 1.0, 2.0, skip_first=0, block_size=16)
    assert out["context_approximated_steps"] == 1
    assert out["all"]["flops_per_s"] == step_cost(SMALL, 2, 4 * 16, 1.0, 2.0, sampled_rows=2)[0]


def test_measure_peak_is_positive_and_finite() -> None:
    peak = measure_peak("cpu", n=256, repeats=2)
    for key in ("peak_flops", "peak_bytes_per_s"):
        assert math.isfinite(peak[key]) and peak[key] > 0
