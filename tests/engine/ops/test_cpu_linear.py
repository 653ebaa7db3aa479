"""Re-laid-out linears on CPU (the engine's kernel, oneDNN where it is not built): the same
products as F.linear at every tile height and path, what the engine packs, and that packing
changes no greedy token."""

import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from engine import LLM, SamplingParams, model_store
from engine.model.loader import load_model
from engine.ops import cpu_kernels
from engine.ops.cpu_linear import MKL_MIN_ROWS, PackedLinear, onednn_packing_enabled
from engine.ops.fp8 import FP8, Fp8Linear, dequantize

pytestmark = pytest.mark.skipif(
    not onednn_packing_enabled(torch.float32, torch.device("cpu")), reason="no oneDNN"
)


# Every tile height of the kernel (1-6 rows, then 6 + 1..6; on AVX-512 1-8, then 8 + 1..8),
# and oneDNN's and MKL's ranges.
ROWS = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 13, 32, 65, MKL_MIN_ROWS - 1, MKL_MIN_ROWS]


# (96, 160): whole blocks of 16 weight rows; (101, 163): a padded last block.
@pytest.mark.parametrize("shape", [(96, 160), (101, 163)])
@pytest.mark.parametrize("rows", ROWS)
def test_packed_linear_equals_f_linear(rows: int, shape: tuple[int, int]) -> None:
    g = torch.Generator().manual_seed(rows)
    linear = torch.nn.Linear(*shape, bias=False)
    torch.nn.init.normal_(linear.weight, generator=g)
    x = torch.randn(rows, shape[0], generator=g)
    x2 = torch.randn(rows, 2 * shape[0], generator=g)[:, ::2]  # a strided view
    packed = PackedLinear.from_linear(linear)
    with torch.inference_mode():
        got, strided = packed(x), packed(x2)
    assert got.shape == (rows, shape[1]) and got.is_contiguous()
    torch.testing.assert_close(got, F.linear(x, linear.weight), rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(strided, F.linear(x2, linear.weight), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("shape", [(96, 160), (101, 163)])
@pytest.mark.parametrize("rows", [0, 1, 2, 3, 4, 5, 6, 7, 12, 13, 65])
def test_fp8_blocks_give_the_upcast_weights_product(rows: int, shape: tuple[int, int]) -> None:
    """`servebench::linear_fp8`: upcast in registers up to 3 rows, a block upcast once from 4
    (then float32's tiles of 6 rows and a partial one), against the dequantized weight."""
    g = torch.Generator().manual_seed(rows)
    linear = torch.nn.Linear(*shape, bias=False)
    torch.nn.init.normal_(linear.weight, generator=g)
    fp8 = Fp8Linear.from_linear(linear)
    packed = PackedLinear.from_fp8(fp8)
    assert packed.packed_weight.dtype == FP8 and packed.weight_scale is not None
    x = torch.randn(rows, shape[0], generator=g)
    x2 = torch.randn(rows, 2 * shape[0], generator=g)[:, ::2]
    weight = dequantize(fp8.weight, fp8.weight_scale[:, None], torch.float32)
    with torch.inference_mode():
        for inputs in (x, x2):
            got = packed(inputs)
            assert got.shape == (rows, shape[1])
            torch.testing.assert_close(got, F.linear(inputs, weight), rtol=1e-5, atol=1e-4)
            torch.testing.assert_close(got, fp8(inputs), rtol=1e-5, atol=1e-4)


def test_fp8_engine_runs_the_kernel_and_gives_the_upcast_paths_tokens(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The engine's fp8 layers through the kernel, compiled, against Fp8Linear's upcast-then-
    MKL product (what a machine without the kernel runs): the same greedy tokens."""
    prompts = [[5, 17, 99, 3, 42, 7], list(range(20, 61)), [1, 2]]
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    args = dict(dtype="float32", quantization="fp8", num_kv_blocks=64, seed=11)
    fast = LLM("tiny-llama", **args)
    assert fast.llm_engine.linears == "fp8 kernel"
    assert fast.llm_engine.model_forward == "compiled"
    got = [o.outputs[0].token_ids for o in fast.generate(prompts, params)]
    model_store.load_shared.cache_clear()  # the next engine loads and packs its own copy
    monkeypatch.setattr(cpu_kernels, "available", lambda: False)
    try:
        upcast = LLM("tiny-llama", **args)
        assert upcast.llm_engine.linears == "fp8"
        want = [o.outputs[0].token_ids for o in upcast.generate(prompts, params)]
    finally:
        model_store.load_shared.cache_clear()
    assert got == want


@pytest.mark.parametrize("shape", [(96, 160), (101, 163)])  # k a multiple of 32, and not
def test_row_major_kernel_equals_f_linear(shape: tuple[int, int]) -> None:
    """`servebench::linear_rows` (a tied LM head kept unpacked) at every row count the model
    sends it (up to 8), and the logits of a model whose tied head is unpacked."""
    assert cpu_kernels.available()
    g = torch.Generator().manual_seed(7)
    w = torch.randn(shape[1], shape[0], generator=g)
    for rows in range(9):
        x = torch.randn(rows, shape[0], generator=g)
        got = torch.ops.servebench.linear_rows(x, w)
        torch.testing.assert_close(got, F.linear(x, w), rtol=1e-5, atol=1e-4)
    model = load_model("tiny-llama", torch.float32, torch.device("cpu")).model
    model.pack_for_cpu(tied_head=False)
    assert isinstance(model.lm_head, torch.nn.Linear)
    hidden = torch.randn(3, model.config.hidden_size, generator=g)
    with torch.inference_mode():
        want = F.linear(hidden, model.lm_head.weight)
        torch.testing.assert_close(model.compute_logits(hidden), want, rtol=1e-5, atol=1e-4)


def test_the_kernel_is_built_here() -> None:
    assert cpu_kernels.available(), "torch's extension builder failed here (see the warning)"
    packed = PackedLinear(torch.ones(20, 8))
    assert packed.native and packed.packed_weight.shape == (2, 8, 16)  # 2 blocks, padded


def test_without_the_kernel_oneDNN_computes_the_same_product() -> None:
    code = (
        "import torch, torch.nn.functional as F; "
        "from engine.ops.cpu_kernels import available; "
        "from engine.ops.cpu_linear import PackedLinear; "
        "assert not available(); w = torch.randn(40, 24); p = PackedLinear(w); "
        "assert not p.native and p.packed_weight.layout == torch._mkldnn; "
        "[torch.testing.assert_close(p(x), F.linear(x, w), rtol=1e-5, atol=1e-4) "
        "for x in (torch.randn(3, 24), torch.randn(70, 24))]"
    )
    env = {**os.environ, "SERVEBENCH_CPU_KERNELS": "0"}
    subprocess.run([sys.executable, "-c", code], env=env, check=True)


def test_bias_is_refused() -> None:
    with pytest.raises(ValueError, match="bias"):
        PackedLinear.from_linear(torch.nn.Linear(8, 8, bias=True))


def test_pack_for_cpu_packs_fp8_layers_and_counts_a_tied_heads_copy() -> None:
    model = load_model("tiny-llama", torch.float32, torch.device("cpu")).model
    assert model.config.tie_word_embeddings
    model.quantize_fp8()
    fp8_bytes, bf16_bytes = model.weight_bytes(), model.weight_bytes(torch.bfloat16)
    model.pack_for_cpu(tied_head=False)
    down = model.layers[0].mlp.down_proj
    assert isinstance(down, PackedLinear) and down.packed_weight.dtype == FP8  # blocks of e4m3
    assert isinstance(model.lm_head, torch.nn.Linear)
    assert model.weight_bytes() == fp8_bytes
    model.pack_for_cpu()
    assert isinstance(model.lm_head, PackedLinear)
    head = model.embed_tokens.weight
    assert model.weight_bytes() == fp8_bytes + head.numel() * head.element_size()
    assert model.weight_bytes(torch.bfloat16) == bf16_bytes


def test_an_untied_head_is_packed_without_a_copy() -> None:
    model = load_model("tiny-llama-untied", torch.float32, torch.device("cpu")).model
    before = model.weight_bytes(), model.weight_bytes(torch.bfloat16)
    model.pack_for_cpu()
    assert isinstance(model.lm_head, PackedLinear)
    assert (model.weight_bytes(), model.weight_bytes(torch.bfloat16)) == before


def test_engine_packs_by_default_and_greedy_tokens_do_not_change(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    prompts = [[5, 17, 99, 3, 42, 7], list(range(20, 61)), [1, 2]]
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    args = dict(dtype="float32", num_kv_blocks=64, seed=3)
    packed = LLM("tiny-llama", **args)
    assert isinstance(packed.llm_engine.runner.model.layers[0].self_attn.qkv_proj, PackedLinear)
    assert packed.llm_engine.linears == "kernel"
    monkeypatch.setenv("SERVEBENCH_ONEDNN", "0")
    plain = LLM("tiny-llama", **args)
    assert isinstance(plain.llm_engine.runner.model.layers[0].mlp.down_proj, torch.nn.Linear)
    assert plain.llm_engine.linears == "torch"
    got = [o.outputs[0].token_ids for o in packed.generate(prompts, params)]
    want = [o.outputs[0].token_ids for o in plain.generate(prompts, params)]
    assert got == want
