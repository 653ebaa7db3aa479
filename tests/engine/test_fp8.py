"""FP8 weights and KV cache: rounding bounds, the matmul paths, attention over an fp8 cache,
capacity at a fixed memory budget, and greedy determinism across batching settings."""

from typing import Any

import pytest
import torch
import torch.nn.functional as F

from engine import LLM, SamplingParams
from engine.config import EngineConfig
from engine.core.request import Request
from engine.engine import LLMEngine
from engine.model.loader import load_model
from engine.ops import KVCache, paged_attention, write_kv_cache
from engine.ops.fp8 import (
    FP8,
    FP8_MAX,
    Fp8Linear,
    dequantize,
    fp8_linear,
    quantize_per_channel,
    upcast,
)
from engine.runner import ModelRunner

# e4m3: 3 mantissa bits, so rounding to nearest is within 2**-4 of a normal value; below the
# smallest normal (2**-6) values sit on a grid of 2**-9, so within 2**-10 (times the scale).
REL_ROUND, SUBNORMAL_ROUND = 2**-4, 2**-10


def test_upcast_is_exact_for_every_finite_code() -> None:
    codes = torch.arange(256, dtype=torch.uint8).view(FP8)
    want = codes.float()
    finite = ~want.isnan()
    got, factor = upcast(codes, torch.float32)
    assert torch.equal(got[finite] * factor, want[finite])
    assert finite.sum() == 254


@pytest.mark.parametrize("spread", [1.0, 1e-3, 1e4])
def test_per_channel_round_trip_is_within_e4m3_rounding(spread: float) -> None:
    g = torch.Generator().manual_seed(0)
    w = torch.randn(96, 80, generator=g) * spread
    w[3] = 0.0  # an all-zero channel
    w[5, 7] = 50 * spread  # an outlier only widens its own channel's scale
    q, scale = quantize_per_channel(w)
    assert q.dtype == FP8 and scale.shape == (96,)
    back = dequantize(q, scale[:, None], torch.float32)
    bound = torch.maximum(w.abs() * REL_ROUND, SUBNORMAL_ROUND * scale[:, None])
    assert ((back - w).abs() <= bound * 1.0001).all()
    assert torch.equal(back[3], torch.zeros(80))
    # each channel's largest value lands on 448 exactly
    assert torch.equal(q.float().abs().amax(1)[torch.arange(96) != 3], torch.full((95,), FP8_MAX))


def test_quantize_clamps_instead_of_overflowing_to_nan() -> None:
    from engine.ops.fp8 import quantize

    q = quantize(torch.tensor([1e6, -1e6, 3.0]), torch.tensor(1.0))
    assert q.float().tolist() == [FP8_MAX, -FP8_MAX, 3.0]


@pytest.mark.parametrize("scaled_mm", [False, True], ids=["weight-only", "w8a8-scaled-mm"])
def test_fp8_linear_matches_a_float_reference(scaled_mm: bool) -> None:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 7, 128, generator=g)
    w = torch.randn(64, 128, generator=g) * 0.05
    q, scale = quantize_per_channel(w)
    y = fp8_linear(x, q, scale, scaled_mm)
    assert y.shape == (2, 7, 64) and y.dtype == x.dtype
    exact = F.linear(x, dequantize(q, scale[:, None], torch.float32))
    if not scaled_mm:  # weight-only: the same math as the dequantized weight, to float rounding
        torch.testing.assert_close(y, exact, rtol=1e-5, atol=1e-5)
    # Against the unquantized layer: stated tolerance, relative error of the whole output.
    # Weight-only rounding alone gives ~2-3 %; W8A8 adds the activations' rounding.
    rel = ((y - F.linear(x, w)).norm() / F.linear(x, w).norm()).item()
    assert rel < (0.04 if not scaled_mm else 0.06), rel


def test_weight_only_path_is_the_same_when_cut_into_row_blocks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import engine.ops.fp8 as fp8

    x = torch.randn(3, 5, 128)
    q, scale = quantize_per_channel(torch.randn(64, 128))
    whole = fp8_linear(x, q, scale, scaled_mm=False)  # one block
    monkeypatch.setattr(fp8, "_CPU_BLOCK_ELEMENTS", 7 * 128)  # 10 blocks, the last one short
    torch.testing.assert_close(fp8_linear(x, q, scale, scaled_mm=False), whole)
    exact = F.linear(x, dequantize(q, scale[:, None], torch.float32))
    torch.testing.assert_close(whole, exact, rtol=1e-5, atol=1e-5)


def test_quantized_model_halves_linear_weights_and_stays_close() -> None:
    ref = load_model("tiny-llama", torch.float32, torch.device("cpu")).model
    fp8 = load_model("tiny-llama", torch.float32, torch.device("cpu")).model
    fp8.quantize_fp8()
    assert isinstance(fp8.layers[0].self_attn.qkv_proj, Fp8Linear)
    assert fp8.layers[0].mlp.down_proj.weight.dtype == FP8
    assert fp8.embed_tokens.weight.dtype == torch.float32  # embeddings stay
    linear = sum(
        m.weight.numel()
        for m in ref.modules()
        if isinstance(m, torch.nn.Linear) and m is not ref.lm_head
    )
    # fp32 -> fp8 saves 3 bytes per linear weight, minus one fp32 scale per output channel
    scales = sum(m.weight_scale.numel() for m in fp8.modules() if isinstance(m, Fp8Linear))
    assert ref.weight_bytes() - fp8.weight_bytes() == 3 * linear - 4 * scales
    assert fp8.weight_bytes(torch.bfloat16) == ref.weight_bytes(torch.bfloat16)
    x = torch.randn(5, 64, generator=torch.Generator().manual_seed(2))
    layer_ref, layer_fp8 = ref.layers[0].mlp, fp8.layers[0].mlp
    rel = (layer_fp8(x) - layer_ref(x)).norm() / layer_ref(x).norm()
    # ~3 % per quantized linear; gate * up then down compounds three of them
    assert rel < 0.1


def _attention_case(kv_dtype: torch.dtype | None) -> torch.Tensor:
    """Random q/k/v through write_kv_cache + paged_attention for a mixed step: two decodes with
    cached context and two prefill chunks, one of them continuing a cached prefix."""
    torch.manual_seed(0)
    cfg = load_model("tiny-llama", torch.float32, torch.device("cpu")).config
    heads, kv_heads, hd, bs = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, 16
    model = load_model("tiny-llama", torch.float32, torch.device("cpu")).model
    scales = None
    if kv_dtype == FP8:  # what calibration would give for N(0, 1) data: amax ~4.5 (x2 headroom)
        s = torch.full((kv_heads, 1, 1), 9.0 / FP8_MAX)
        scales = [(s, s)] * cfg.num_layers
    runner = ModelRunner(model, cfg, 64, bs, seed=0, kv_dtype=kv_dtype, kv_scales=scales)
    cache: KVCache = runner.kv_caches[0]
    lens = [(37, 1), (70, 1), (0, 23), (40, 30)]  # (already cached, new) per request
    reqs, tables, nxt = [], {}, 0
    for i, (cached, new) in enumerate(lens):
        r = Request(f"r{i}", list(range(1, cached + new + 1)), SamplingParams())
        r.num_computed_tokens = cached
        nb = -(-(cached + new) // bs)
        tables[r.request_id] = list(range(nxt, nxt + nb))
        nxt += nb
        reqs.append((r, new))
    # fill the cached context, then the new tokens' K/V, then attend
    total = sum(c + n for c, n in lens)
    k_all = torch.randn(total, kv_heads, hd)
    v_all = torch.randn(total, kv_heads, hd)
    ctx = [(r, r.num_computed_tokens) for r, _ in reqs if r.num_computed_tokens]
    saved = [r.num_computed_tokens for r, _ in reqs]
    for r, _ in reqs:
        r.num_computed_tokens = 0
    _, _, meta0 = runner.prepare_inputs(ctx, tables)
    n_ctx = sum(n for _, n in ctx)
    write_kv_cache(k_all[:n_ctx], v_all[:n_ctx], cache, meta0.slot_mapping)
    for (r, _), s in zip(reqs, saved, strict=True):
        r.num_computed_tokens = s
    _, _, meta = runner.prepare_inputs(reqs, tables)
    n_new = sum(n for _, n in reqs)
    write_kv_cache(k_all[n_ctx:], v_all[n_ctx:], cache, meta.slot_mapping)
    q = torch.randn(n_new, heads, hd)
    return paged_attention(q, cache, meta, hd**-0.5)


def test_attention_over_an_fp8_cache_is_close_to_full_precision() -> None:
    ref = _attention_case(None)
    for dtype, tol in ((torch.bfloat16, 0.01), (FP8, 0.05)):
        out = _attention_case(dtype)
        rel = ((out - ref).norm() / ref.norm()).item()
        assert 0 < rel < tol, (dtype, rel)


def _engine(**kwargs: Any) -> LLMEngine:
    return LLMEngine(EngineConfig.from_kwargs("tiny-llama", dtype="float32", **kwargs))


def test_fp8_kv_cache_doubles_blocks_and_concurrency_at_the_same_budget() -> None:
    budget = 64 * 16 * 2 * 2 * 2 * 16 * 2 / 2**30  # 64 bf16 blocks of tiny-llama
    peaks = {}
    for kv in ("bfloat16", "fp8"):
        e = _engine(kv_cache_dtype=kv, kv_cache_memory_gb=budget, max_num_seqs=512)
        peaks[kv] = e.kv.num_blocks
        params = SamplingParams(max_tokens=40, ignore_eos=True)
        for i in range(160):  # each needs 4 blocks (24 + 40 tokens): far more than fit at once
            e.add_request(f"r{i}", [(i * 7 + j) % 500 + 2 for j in range(24)], params)
        saturated = []  # requests running in each step while others still wait
        while e.has_unfinished_requests():
            e.step()
            if e.stats()["num_waiting"]:
                saturated.append(e.stats()["num_running"])
        peaks[kv + " peak"] = max(saturated)
        peaks[kv + " mean"] = sum(saturated) / len(saturated)
        assert e.stats()["kv_blocks_used"] == 0
    assert peaks["bfloat16"] == 64 and peaks["fp8"] == 128
    for stat in ("peak", "mean"):
        ratio = peaks[f"fp8 {stat}"] / peaks[f"bfloat16 {stat}"]
        assert 1.8 < ratio < 2.2, peaks


def test_engine_records_resolved_kv_dtype_and_weight_memory() -> None:
    e = _engine(kv_cache_dtype="fp8_e4m3", quantization="fp8")
    assert e.config.cache.kv_cache_dtype == "fp8"
    assert _engine().config.cache.kv_cache_dtype == "float32"  # auto: the model's dtype
    assert e.weight_bytes < e.weight_bytes_bf16
    with pytest.raises(ValueError, match="kv_cache_dtype"):
        _engine(kv_cache_dtype="int4")
    with pytest.raises(ValueError, match="quantization"):
        _engine(quantization="awq")


SETTINGS: dict[str, dict[str, Any]] = {
    "chunked-16": dict(max_num_batched_tokens=16),
    "chunked-64": dict(max_num_batched_tokens=64),
    "no-chunked-prefill": dict(enable_chunked_prefill=False, max_num_batched_tokens=512),
    "static": dict(batching="static", max_num_seqs=2),
    "preemption": dict(num_kv_blocks=12, max_num_seqs=8),
}


def test_fp8_greedy_output_is_the_same_across_batching_and_chunking() -> None:
    prompts = [[(i * 31 + j * 7) % 500 + 2 for j in range(n)] for i, n in enumerate((5, 40, 77, 3))]
    params = SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True)

    def tokens(**kwargs: Any) -> list[list[int]]:
        llm = LLM("tiny-llama", dtype="float32", quantization="fp8", kv_cache_dtype="fp8", **kwargs)
        return [list(o.outputs[0].token_ids) for o in llm.generate(prompts, params)]

    baseline = tokens(max_num_seqs=8)
    for name, kwargs in SETTINGS.items():
        assert tokens(**kwargs) == baseline, name


def test_cli_takes_fp8_flags_and_prints_memory() -> None:
    from typer.testing import CliRunner

    from bench_cli.app import app
    from bench_cli.local_server import serve_flags

    args = ["generate", "Hi", "--model", "tiny-smollm2", "--max-tokens", "3"]
    result = CliRunner().invoke(app, [*args, "--quantization", "fp8", "--kv-cache-dtype", "fp8"])
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert "fp8 linears" in text and "(fp8)" in text
    assert serve_flags({"quantization": "fp8", "kv_cache_dtype": "fp8"}) == [
        "--quantization",
        "fp8",
        "--kv-cache-dtype",
        "fp8",
    ]


def test_fp8_kv_engine_with_a_context_shorter_than_the_calibration_text() -> None:
    llm = LLM("tiny-llama", dtype="float32", kv_cache_dtype="fp8", max_model_len=64, seed=3)
    out = llm.generate([[5, 6, 7]], SamplingParams(max_tokens=4, temperature=0.0))
    assert len(out[0].outputs[0].token_ids) == 4
