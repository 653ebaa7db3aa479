"""bf16 on CPU: `servebench::linear_bf16` (AVX512-BF16) against a float32 product of the same
bf16 values, the decode attention kernel over a bf16 cache, the engine's greedy tokens through
the kernel against torch's bf16 linears, and what `dtype="auto"` picks from given timings."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from engine import LLM, SamplingParams, dtype_choice, model_store
from engine.ops import cpu_decode_attention, cpu_kernels, cpu_linear
from engine.ops.cpu_linear import PackedLinear, bf16_blocks

needs_bf16 = pytest.mark.skipif(
    not cpu_kernels.bf16_available(),
    reason="servebench::linear_bf16 needs a CPU with AVX512-BF16 (and the kernels built)",
)


def bf16_close(got: torch.Tensor, want: torch.Tensor) -> None:
    """Within bf16's rounding of the output (8 bits of mantissa) plus a little for float32
    sums taken in another order; a dropped pair, tail or block is off by far more."""
    assert got.dtype == torch.bfloat16 and got.shape == want.shape
    scale = want.abs().max().item() if want.numel() else 1.0
    torch.testing.assert_close(got.float(), want, rtol=2**-7, atol=1e-3 * scale)


# Every tile height (1-8 rows, then passes of 8 and a partial one) and prefill-sized counts.
ROWS = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 13, 16, 17, 23, 64, 130]


@needs_bf16
@pytest.mark.parametrize("shape", [(96, 160), (101, 163), (576, 1536), (7, 3), (64, 80), (33, 112)])
@pytest.mark.parametrize("rows", ROWS)
def test_bf16_kernel_equals_a_float32_product_of_the_same_values(
    rows: int, shape: tuple[int, int]
) -> None:
    """(in, out): whole blocks and pairs; an odd input count and a padded last block; a
    SmolLM2 shape; fewer outputs than a block."""
    k, n = shape
    g = torch.Generator().manual_seed(rows * 1000 + k)
    w = torch.randn(n, k, generator=g).bfloat16()
    x = torch.randn(rows, k, generator=g).bfloat16()
    strided = torch.randn(rows, 2 * k, generator=g).bfloat16()[:, ::2]
    blocks = bf16_blocks(w)
    for inputs in (x, strided):
        got = torch.ops.servebench.linear_bf16(inputs, blocks, n)
        bf16_close(got, F.linear(inputs.float(), w.float()))


@needs_bf16
def test_packed_bf16_linear_holds_half_the_bytes_and_runs_the_kernel() -> None:
    linear = torch.nn.Linear(163, 101, bias=False).bfloat16()
    packed = PackedLinear.from_linear(linear)
    assert packed.packed_weight.dtype == torch.bfloat16
    assert "linear_bf16" in repr(packed)
    assert torch.equal(packed.plain_weight(), linear.weight)
    x = torch.randn(5, 163).bfloat16()
    with torch.inference_mode():
        bf16_close(packed(x), F.linear(x.float(), linear.weight.float()))


def test_bf16_weights_are_packed_only_where_the_kernel_runs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On a CPU without AVX512-BF16 (or with the kernel turned off) a bf16 model keeps torch's
    linears: nothing may call the kernel there."""
    monkeypatch.setenv("SERVEBENCH_BF16_KERNEL", "0")
    assert not cpu_kernels.bf16_available()
    assert not cpu_linear.packing_enabled(torch.bfloat16, torch.device("cpu"))
    with pytest.raises(ValueError, match="linear_bf16 only"):
        PackedLinear(torch.randn(32, 16).bfloat16())


def test_decode_attention_kernel_reads_a_bf16_cache_exactly() -> None:
    """Rows widened in registers (no bf16 instruction: AVX2 builds too) give what the float32
    kernel gives over the same values widened beforehand, and the float32 formula's result."""
    if not cpu_kernels.available():
        pytest.skip("the CPU kernels cannot be built here")
    g = torch.Generator().manual_seed(3)
    heads, group, bs, d, b, nb = 3, 3, 16, 64, 4, 3
    k = torch.randn(heads, 16, bs, d, generator=g).bfloat16()
    v = torch.randn(heads, 16, bs, d, generator=g).bfloat16()
    q = torch.randn(b, heads, group, d, generator=g).bfloat16()
    tables = torch.randperm(16, generator=g)[: b * nb].view(b, nb)
    lens = torch.tensor([[40], [17], [48], [1]])
    mask = torch.arange(nb * bs)[None] < lens
    assert cpu_decode_attention.kernel_fits(q, k)
    got = cpu_decode_attention.paged_decode_attention(q, k, v, tables, mask, d**-0.5)
    assert got.dtype == torch.bfloat16
    f32 = torch.ops.servebench.decode_attention(
        q.float(), k.float(), v.float(), tables, mask, d**-0.5
    )
    torch.testing.assert_close(got, f32.bfloat16(), rtol=0, atol=0)
    want = cpu_decode_attention.decode_attention(
        q.float(), k.float(), v.float(), tables, mask, d**-0.5
    )
    torch.testing.assert_close(f32, want, rtol=1e-5, atol=1e-5)


@needs_bf16
def test_bf16_engine_through_the_kernel_gives_torchs_bf16_greedy_tokens(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The compiled bf16 forward with the kernel's linears and bf16-cache attention, against
    the same model with torch's bf16 linears: identical greedy tokens on the tiny model (both
    round each product's output to bf16; their float32 sums differ only in order)."""
    prompts = [[5, 17, 99, 3, 42, 7], list(range(20, 61)), [1, 2], list(range(100, 140))]
    params = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
    args = dict(dtype="bfloat16", num_kv_blocks=64, seed=11)
    model_store.load_shared.cache_clear()
    try:
        fast = LLM("tiny-llama", **args)
        assert fast.llm_engine.linears == "bf16 kernel"
        assert fast.llm_engine.model_forward == "compiled"
        got = [o.outputs[0].token_ids for o in fast.generate(prompts, params)]
        model_store.load_shared.cache_clear()
        monkeypatch.setenv("SERVEBENCH_BF16_KERNEL", "0")
        torch_path = LLM("tiny-llama", **args)
        assert torch_path.llm_engine.linears == "torch"
        want = [o.outputs[0].token_ids for o in torch_path.generate(prompts, params)]
    finally:
        model_store.load_shared.cache_clear()
    assert got == want


def test_auto_never_picks_bf16_without_native_bf16_whatever_the_timings() -> None:
    cpu = torch.device("cpu")
    odd = {"float32": 1.0, "bfloat16": 0.001}  # a measurement gone wrong
    choice = dtype_choice.choose_dtype(cpu, native_bf16=False, timings=odd)
    assert choice.dtype == "float32" and "no native bf16" in choice.reason


@pytest.mark.parametrize(
    ("f32_ms", "bf16_ms", "want"), [(0.14, 0.06, "bfloat16"), (0.1, 0.3, "float32")]
)
def test_auto_picks_the_faster_measured_dtype_on_a_bf16_cpu(
    f32_ms: float, bf16_ms: float, want: str
) -> None:
    timings = {"float32": f32_ms, "bfloat16": bf16_ms}
    choice = dtype_choice.choose_dtype(torch.device("cpu"), native_bf16=True, timings=timings)
    assert choice.dtype == want
    assert (
        f"{bf16_ms:.3f} ms in bf16" in choice.reason
        and f"{f32_ms:.3f} ms in float32" in choice.reason
    )


def test_auto_is_bf16_on_cuda_without_measuring() -> None:
    assert dtype_choice.choose_dtype(torch.device("cuda"), native_bf16=False).dtype == "bfloat16"


def test_the_measurement_is_cached_per_machine(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    calls = []

    def measure() -> dict[str, float]:
        calls.append(1)
        return {"float32": 0.2, "bfloat16": 0.1}

    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    monkeypatch.setattr(dtype_choice, "decode_linear_ms", measure)
    cpu = torch.device("cpu")
    first = dtype_choice.choose_dtype(cpu, native_bf16=True)
    second = dtype_choice.choose_dtype(cpu, native_bf16=True)
    assert first.dtype == second.dtype == "bfloat16" and len(calls) == 1
    assert "measured now" in first.reason and "cached in" in second.reason
    (cached,) = tmp_path.glob("servebench-dtype-*.json")
    assert dtype_choice.machine_key() in cached.name
    assert json.loads(cached.read_text())["decode_linear_ms"] == {"float32": 0.2, "bfloat16": 0.1}
    monkeypatch.setattr(dtype_choice, "cpu_flags", lambda: {"avx2", "avx512_bf16", "amx_bf16"})
    dtype_choice.choose_dtype(cpu, native_bf16=True)  # another CPU: measured again
    assert len(calls) == 2


def test_the_engine_says_which_dtype_auto_chose_and_why(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="engine.engine"):
        llm = LLM("tiny-llama", num_kv_blocks=8)  # SERVEBENCH_CPU_BF16=0 (conftest)
    assert llm.llm_engine.config.dtype == "float32"
    assert "dtype float32: this CPU has no native bf16" in caplog.text
    assert llm.llm_engine.dtype_choice.dtype == "float32"
