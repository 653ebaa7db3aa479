"""oneDNN-prepacked linears on CPU: the same products as F.linear on both of their paths,
what the engine packs, and that packing changes no greedy token."""

import pytest
import torch
import torch.nn.functional as F

from engine import LLM, SamplingParams
from engine.model.loader import load_model
from engine.ops.cpu_linear import MKL_MIN_ROWS, PackedLinear, onednn_packing_enabled
from engine.ops.fp8 import Fp8Linear

pytestmark = pytest.mark.skipif(
    not onednn_packing_enabled(torch.float32, torch.device("cpu")), reason="no oneDNN"
)


@pytest.mark.parametrize("rows", [0, 1, 7, 32, MKL_MIN_ROWS - 1, MKL_MIN_ROWS])
def test_packed_linear_equals_f_linear(rows: int) -> None:
    g = torch.Generator().manual_seed(rows)
    linear = torch.nn.Linear(96, 160, bias=False)
    torch.nn.init.normal_(linear.weight, generator=g)
    x = torch.randn(rows, 96, generator=g)
    packed = PackedLinear.from_linear(linear)
    with torch.inference_mode():
        got = packed(x)
    assert got.shape == (rows, 160) and got.is_contiguous()
    torch.testing.assert_close(got, F.linear(x, linear.weight), rtol=1e-5, atol=1e-4)


def test_bias_is_refused() -> None:
    with pytest.raises(ValueError, match="bias"):
        PackedLinear.from_linear(torch.nn.Linear(8, 8, bias=True))


def test_pack_for_cpu_keeps_fp8_layers_and_counts_a_tied_heads_copy() -> None:
    model = load_model("tiny-llama", torch.float32, torch.device("cpu")).model
    assert model.config.tie_word_embeddings
    model.quantize_fp8()
    fp8_bytes, bf16_bytes = model.weight_bytes(), model.weight_bytes(torch.bfloat16)
    model.pack_for_cpu(tied_head=False)
    assert isinstance(model.layers[0].mlp.down_proj, Fp8Linear)  # fp8 has its own matmul
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
    monkeypatch.setenv("SERVEBENCH_ONEDNN", "0")
    plain = LLM("tiny-llama", **args)
    assert isinstance(plain.llm_engine.runner.model.layers[0].mlp.down_proj, torch.nn.Linear)
    got = [o.outputs[0].token_ids for o in packed.generate(prompts, params)]
    want = [o.outputs[0].token_ids for o in plain.generate(prompts, params)]
    assert got == want
