"""Model loading: Hugging Face directories against transformers, llama.cpp's RoPE permutation,
error messages, tiny random models and SmolLM2's GGUF metadata."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from engine import LLM, SamplingParams
from engine.config import ModelConfig
from engine.model.loader import (
    PACKAGED_MODELS,
    TINY_CONFIGS,
    ModelLoadError,
    _read_gguf,
    load_model,
    resolve_model_path,
    unpermute_rope,
)

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # no network: transformers must not try the Hub

CPU = torch.device("cpu")
PROMPT = [5, 17, 99, 3, 200, 42, 7, 128, 64, 1, 250, 33]
MAX_TOKENS = 8
# float32 on CPU: observed |ours - HF| <= ~5e-5 on logits of magnitude up to ~30.
LOGITS_ATOL, LOGITS_RTOL = 1e-3, 1e-4
INIT_SEED = 5  # top-2 logit gaps on the greedy path >= 0.45 for both checkpoints


# ---- (a) Hugging Face directories ------------------------------------------------------------


@pytest.fixture(scope="module", params=[True, False], ids=["tied", "untied"])
def hf_checkpoint(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A tiny random transformers Llama saved as safetensors; returns (model, directory)."""
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        rope_theta=10000.0,
        rms_norm_eps=1e-5,
        max_position_embeddings=256,
        tie_word_embeddings=request.param,
        bos_token_id=1,
        eos_token_id=2,
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).eval()
    # Peaked logits, so greedy choices are not decided by float noise: weights ~ 3/sqrt(fan_in),
    # embeddings ~ N(0, 1), and norm weights away from 1 so that they must be loaded too.
    g = torch.Generator().manual_seed(INIT_SEED)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
            elif name.endswith("embed_tokens.weight"):
                p.copy_(torch.randn(p.shape, generator=g))
            else:
                p.copy_(3.0 * torch.randn(p.shape, generator=g) / math.sqrt(p.shape[-1]))
    path = tmp_path_factory.mktemp("hf_llama_tied" if request.param else "hf_llama_untied")
    model.save_pretrained(path, safe_serialization=True)
    return model, path


@pytest.fixture(scope="module")
def hf_greedy(hf_checkpoint: Any) -> tuple[list[int], torch.Tensor]:
    """HF's greedy continuation of PROMPT and its logits at every position of the sequence."""
    model, _ = hf_checkpoint
    with torch.no_grad():
        out = model.generate(
            torch.tensor([PROMPT]),
            do_sample=False,
            max_new_tokens=MAX_TOKENS,
            min_new_tokens=MAX_TOKENS,
            attention_mask=torch.ones(1, len(PROMPT), dtype=torch.long),
            pad_token_id=0,
        )
        generated = out[0, len(PROMPT) :].tolist()
        logits = model(out[:, :-1]).logits[0].float()  # [len(PROMPT) + MAX_TOKENS - 1, vocab]
    return generated, logits


@pytest.fixture(scope="module")
def ours_greedy(hf_checkpoint: Any) -> tuple[list[int], torch.Tensor]:
    """Our engine's greedy continuation and the logits of every position it computed."""
    _, path = hf_checkpoint
    llm = LLM(model=str(path), dtype="float32", num_kv_blocks=32, max_model_len=128, device="cpu")
    model = llm.llm_engine.runner.model
    hidden: list[torch.Tensor] = []
    # The final norm's output is the hidden state, whichever forward (eager or compiled) ran.
    hook = model.norm.register_forward_hook(lambda _m, _i, out: hidden.append(out.detach().clone()))
    try:
        params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0, ignore_eos=True)
        (result,) = llm.generate([PROMPT], params)
    finally:
        hook.remove()
    with torch.no_grad():  # prefill rows, then one row per decode step
        logits = model.compute_logits(torch.cat(hidden))
    return list(result.outputs[0].token_ids), logits


def test_hf_dir_config_is_read(hf_checkpoint: Any) -> None:
    model, path = hf_checkpoint
    loaded = load_model(str(path), torch.float32, CPU)
    c = loaded.config
    assert (c.vocab_size, c.hidden_size, c.intermediate_size) == (256, 64, 128)
    assert (c.num_layers, c.num_heads, c.num_kv_heads, c.head_dim) == (2, 4, 2, 16)
    assert c.rope_theta == 10000.0 and c.rms_norm_eps == 1e-5
    assert c.max_position_embeddings == 256
    assert c.tie_word_embeddings == model.config.tie_word_embeddings
    assert c.eos_token_ids == (2,) and c.bos_token_id == 1
    assert loaded.tokenizer is None  # no tokenizer.json was saved
    assert loaded.source == str(path)


def test_hf_dir_weights_land_in_fused_layout(hf_checkpoint: Any) -> None:
    hf, path = hf_checkpoint
    ours = load_model(str(path), torch.float32, CPU).model
    sd = hf.state_dict()
    for i, layer in enumerate(ours.layers):
        p = f"model.layers.{i}."
        qkv = torch.cat([sd[p + f"self_attn.{n}_proj.weight"] for n in "qkv"])
        torch.testing.assert_close(layer.self_attn.qkv_proj.weight, qkv, rtol=0, atol=0)
        gate_up = torch.cat([sd[p + "mlp.gate_proj.weight"], sd[p + "mlp.up_proj.weight"]])
        torch.testing.assert_close(layer.mlp.gate_up_proj.weight, gate_up, rtol=0, atol=0)
        torch.testing.assert_close(layer.input_layernorm.weight, sd[p + "input_layernorm.weight"])
    torch.testing.assert_close(ours.lm_head.weight, sd["lm_head.weight"], rtol=0, atol=0)
    tied = ours.lm_head.weight.data_ptr() == ours.embed_tokens.weight.data_ptr()
    assert tied == hf.config.tie_word_embeddings


def test_hf_dir_greedy_generation_matches_transformers(
    hf_greedy: tuple[list[int], torch.Tensor], ours_greedy: tuple[list[int], torch.Tensor]
) -> None:
    assert len(ours_greedy[0]) == MAX_TOKENS
    assert ours_greedy[0] == hf_greedy[0]


def test_hf_dir_logits_match_transformers(
    hf_greedy: tuple[list[int], torch.Tensor], ours_greedy: tuple[list[int], torch.Tensor]
) -> None:
    ref, ours = hf_greedy[1], ours_greedy[1]
    assert ours.shape == ref.shape == (len(PROMPT) + MAX_TOKENS - 1, 256)
    torch.testing.assert_close(ours, ref, atol=LOGITS_ATOL, rtol=LOGITS_RTOL)


def test_hf_dir_greedy_choices_are_clear_cut(hf_greedy: tuple[list[int], torch.Tensor]) -> None:
    # Guards the test setup. Logits within the tolerance cannot flip a choice whose top-2 gap
    # exceeds twice the tolerance; and EOS (2) is never the choice, so HF's min_new_tokens
    # (which masks EOS) and our ignore_eos (which does not) pick the same tokens.
    top2 = hf_greedy[1][len(PROMPT) - 1 :].topk(2, dim=-1)
    gap = top2.values[:, 0] - top2.values[:, 1]
    tolerance = LOGITS_ATOL + LOGITS_RTOL * top2.values[:, 0].abs()
    assert (gap > 2 * tolerance).all(), (gap, tolerance)
    assert 2 not in top2.indices[:, 0].tolist()


# ---- (b) llama.cpp's RoPE row permutation -------------------------------------------------------


def _llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """convert_hf_to_gguf.py's LlamaModel.permute (rotate-half rows -> interleaved pairs)."""
    return (
        w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


@pytest.mark.parametrize("n_head", [3, 9])
def test_unpermute_rope_inverts_llama_cpp_permute(n_head: int) -> None:
    rng = np.random.default_rng(n_head)
    head_dim, cols = 64, 40
    w = rng.standard_normal((n_head * head_dim, cols)).astype(np.float32)
    permuted = _llama_cpp_permute(w, n_head)
    assert not np.array_equal(permuted, w)
    np.testing.assert_array_equal(unpermute_rope(permuted, n_head), w)
    np.testing.assert_array_equal(_llama_cpp_permute(unpermute_rope(w, n_head), n_head), w)


def test_unpermute_rope_restores_rotate_half_order_within_each_head() -> None:
    # Row r of head h after llama.cpp's permute holds pair element r % 2 of index r // 2.
    n_head, head_dim = 3, 8
    w = np.arange(n_head * head_dim, dtype=np.float32)[:, None]
    interleaved = np.concatenate(
        [
            np.stack([h * head_dim + np.arange(4), h * head_dim + 4 + np.arange(4)], 1).reshape(-1)
            for h in range(n_head)
        ]
    ).astype(np.float32)[:, None]
    np.testing.assert_array_equal(_llama_cpp_permute(w, n_head), interleaved)
    np.testing.assert_array_equal(unpermute_rope(interleaved, n_head), w)


# ---- (c) errors and tiny models -----------------------------------------------------------------


def test_missing_path_error_names_path_and_expected_forms(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere" / "model.gguf"
    with pytest.raises(ModelLoadError) as exc:
        load_model(str(missing), torch.float32, CPU)
    msg = str(exc.value)
    assert str(missing) in msg
    assert ".gguf" in msg and "config.json" in msg and "safetensors" in msg


@pytest.mark.parametrize("content", [{}, {"config.json": "{}"}, {"model.safetensors": ""}])
def test_directory_without_config_and_safetensors_is_rejected(
    tmp_path: Path, content: dict[str, str]
) -> None:
    for name, text in content.items():
        (tmp_path / name).write_text(text)
    with pytest.raises(ModelLoadError) as exc:
        load_model(str(tmp_path), torch.float32, CPU)
    msg = str(exc.value)
    assert str(tmp_path) in msg
    assert "config.json" in msg and "safetensors" in msg


@pytest.fixture(scope="module")
def gguf_head() -> bytes:
    """The first 200 kB of SmolLM2's GGUF file: a valid header cut off inside the metadata."""
    with resolve_model_path("smollm2-135m").open("rb") as f:
        return f.read(200_000)


@pytest.mark.parametrize("cut", [0, 3, 16, 200, 200_000])
def test_truncated_gguf_raises_model_load_error_naming_path(
    tmp_path: Path, gguf_head: bytes, cut: int
) -> None:
    path = tmp_path / "truncated.gguf"
    path.write_bytes(gguf_head[:cut])
    with pytest.raises(ModelLoadError) as exc:
        load_model(str(path), torch.float32, CPU)
    assert str(path) in str(exc.value)


def test_garbage_gguf_raises_model_load_error_naming_path(tmp_path: Path) -> None:
    path = tmp_path / "garbage.gguf"
    path.write_bytes(np.random.default_rng(0).bytes(4096))
    with pytest.raises(ModelLoadError) as exc:
        load_model(str(path), torch.float32, CPU)
    assert str(path) in str(exc.value)


def test_file_of_unknown_kind_is_rejected(tmp_path: Path) -> None:
    path = tmp_path / "model.bin"
    path.write_bytes(b"\0" * 16)
    with pytest.raises(ModelLoadError) as exc:
        load_model(str(path), torch.float32, CPU)
    assert str(path) in str(exc.value) and ".gguf" in str(exc.value)


def test_unknown_model_name_lists_known_names() -> None:
    with pytest.raises(ModelLoadError) as exc:
        load_model("tiny-lama", torch.float32, CPU)
    msg = str(exc.value)
    assert "tiny-lama" in msg
    for known in [*TINY_CONFIGS, *PACKAGED_MODELS]:
        assert known in msg


def test_tiny_model_is_deterministic_for_a_seed() -> None:
    a = load_model("tiny-llama", torch.float32, CPU, seed=3).model.state_dict()
    b = load_model("tiny-llama", torch.float32, CPU, seed=3).model.state_dict()
    c = load_model("tiny-llama", torch.float32, CPU, seed=4).model.state_dict()
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=0, atol=0)
    assert not torch.equal(a["embed_tokens.weight"], c["embed_tokens.weight"])


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-llama-untied"])
def test_tiny_model_ties_embeddings_as_configured(name: str) -> None:
    loaded = load_model(name, torch.float32, CPU)
    model = loaded.model
    tied = model.lm_head.weight.data_ptr() == model.embed_tokens.weight.data_ptr()
    assert tied == loaded.config.tie_word_embeddings == (name == "tiny-llama")
    assert loaded.source == "random" and loaded.tokenizer is None


def test_dummy_weights_take_the_shape_of_a_config_json_and_its_tokenizer(tmp_path: Path) -> None:
    """--load-format dummy (vLLM's): any config.json's shape with random weights and the
    tokenizer beside it, so models whose weights are not here can be timed end to end."""
    import json

    from engine.model.export import export_tokenizer
    from engine.model.sources import load_tokenizer

    export_tokenizer(load_tokenizer("smollm2-135m"), tmp_path)
    shape = {"hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 3}
    shape |= {"num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 49152}
    (tmp_path / "config.json").write_text(json.dumps(shape))
    loaded = load_model(str(tmp_path), torch.float32, CPU, seed=1, load_format="dummy")
    assert loaded.source == "dummy" and loaded.tokenizer is not None
    assert loaded.config.num_layers == 3 and loaded.config.hidden_size == 128
    weights = dict(loaded.model.named_parameters())
    assert (weights["norm.weight"] == 1).all()
    assert 0 < weights["layers.0.mlp.down_proj.weight"].abs().max() <= 1e-3
    again = load_model(str(tmp_path), torch.float32, CPU, seed=2, load_format="dummy")
    other = dict(again.model.named_parameters())["layers.0.mlp.down_proj.weight"]
    assert not torch.equal(other, weights["layers.0.mlp.down_proj.weight"])
    llm = LLM(str(tmp_path), load_format="dummy", enforce_eager=True)
    out = llm.generate(["Hello there"], SamplingParams(max_tokens=5, ignore_eos=True))
    assert len(out[0].outputs[0].token_ids) == 5  # noise, but five tokens of it
    with pytest.raises(ValueError, match="load_format"):
        LLM(str(tmp_path), load_format="safetensors")


# ---- (d) SmolLM2 GGUF metadata --------------------------------------------------------------


@pytest.fixture(scope="module")
def smollm2_config() -> ModelConfig:
    cfg, weights, _tokenizer = _read_gguf(resolve_model_path("smollm2-135m"))
    weights.close()  # a lazy generator: closing it dequantizes nothing
    return cfg


def test_smollm2_gguf_metadata_is_read(smollm2_config: ModelConfig) -> None:
    c = smollm2_config
    assert c.num_layers == 30
    assert c.hidden_size == 576
    assert c.num_heads == 9 and c.num_kv_heads == 3 and c.head_dim == 64
    assert c.intermediate_size == 1536
    assert c.vocab_size == 49152
    assert c.rope_theta == 100000.0
    assert c.tie_word_embeddings
    assert c.eos_token_ids == (2,)
    assert c.bos_token_id == 1
    assert c.max_position_embeddings == 8192
    assert c.rms_norm_eps == pytest.approx(1e-5)
