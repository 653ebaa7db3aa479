"""Load a Llama-family model by name or path: GGUF files (every tensor dequantized through the
`gguf` package), Hugging Face directories (config.json + *.safetensors), or a tiny random
config for tests."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from engine.config import ModelConfig
from engine.model.llama import LlamaForCausalLM
from engine.model.shapes import gguf_config, model_shape
from engine.model.sources import (  # also re-exported: the names callers know
    PACKAGED_MODELS,
    TINY_CONFIGS,
    TINY_TOKENIZERS,
    ModelLoadError,
    load_tokenizer,
    resolve_model_path,
)
from engine.model.tokenizer import Tokenizer


@dataclass(slots=True)
class LoadedModel:
    model: LlamaForCausalLM
    config: ModelConfig
    tokenizer: Tokenizer | None
    source: str  # the file or directory read, or "random" for tiny configs


def load_model(
    name: str, dtype: torch.dtype, device: torch.device, seed: int = 0, load_format: str = "auto"
) -> LoadedModel:
    if load_format == "dummy":
        return _load_dummy(name, dtype, device, seed)
    if name in TINY_CONFIGS:
        cfg = TINY_CONFIGS[name]
        model = _build(cfg, device)
        _init_random(model, seed)
        tokenizer = load_tokenizer(TINY_TOKENIZERS[name]) if name in TINY_TOKENIZERS else None
        return LoadedModel(model.to(dtype), cfg, tokenizer, "random")
    path = resolve_model_path(name)
    try:
        if path.is_file() and path.suffix == ".gguf":
            cfg, weights, tokenizer = _read_gguf(path)
        elif path.is_dir():
            cfg, weights, tokenizer = _read_hf_dir(path)
        else:
            raise ModelLoadError(
                f"model path {path}: expected a .gguf file or a Hugging Face model directory"
            )
        model = _build(cfg, device)
        model.load_hf_weights((n, t.to(device)) for n, t in weights)
    except ModelLoadError:
        raise
    except Exception as e:  # a truncated or foreign file: say which, and why
        raise ModelLoadError(f"could not load model from {path}: {type(e).__name__}: {e}") from e
    return LoadedModel(model.to(dtype), cfg, tokenizer, str(path))


def _build(cfg: ModelConfig, device: torch.device) -> LlamaForCausalLM:
    with torch.device("meta"):
        model = LlamaForCausalLM(cfg)
    model = model.to_empty(device=device)
    if cfg.tie_word_embeddings:
        model.lm_head.weight = model.embed_tokens.weight
    return model.eval()


def _init_random(model: LlamaForCausalLM, seed: int) -> None:
    """Weights scaled so activations stay O(1) and logits are peaked: greedy choices are
    clear-cut, so paged and unpaged forward passes must agree token for token."""
    g = torch.Generator().manual_seed(seed)
    for name, p in model.named_parameters():
        if name.endswith("norm.weight"):
            w = 1.0 + 0.1 * torch.randn(p.shape, generator=g)
        elif name == "embed_tokens.weight":
            w = torch.randn(p.shape, generator=g)
        else:
            w = 3.0 * torch.randn(p.shape, generator=g) / math.sqrt(p.shape[-1])
        p.data.copy_(w)


def _load_dummy(name: str, dtype: torch.dtype, device: torch.device, seed: int) -> LoadedModel:
    """vLLM's --load-format dummy: the shape of `name` (no weights read) with small uniform
    random weights drawn on the device, norms at one. What it generates is noise; how long
    its steps take is the model's. The tokenizer is the model's where it has one (a GGUF's,
    or a tokenizer.json beside the config.json)."""
    cfg = model_shape(name)
    model = _build(cfg, device).to(dtype)
    g = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if pname.endswith("norm.weight"):
                p.fill_(1.0)
            else:
                p.uniform_(-1e-3, 1e-3, generator=g)
    tokenizer = None
    path = Path(name).expanduser()
    folder = path if path.is_dir() else path.parent
    if path.suffix == ".gguf" or name in PACKAGED_MODELS:
        tokenizer = load_tokenizer(name)
    elif (folder / "tokenizer.json").is_file() and (path.is_dir() or path.suffix == ".json"):
        tokenizer = load_tokenizer(str(folder))
    return LoadedModel(model, cfg, tokenizer, "dummy")


# ---- GGUF --------------------------------------------------------------------------------

_GGUF_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}


def _gguf_to_hf_name(name: str) -> str:
    if name == "token_embd.weight":
        return "model.embed_tokens.weight"
    if name == "output_norm.weight":
        return "model.norm.weight"
    if name == "output.weight":
        return "lm_head.weight"
    blk, layer, kind, suffix = name.split(".")
    if blk != "blk" or kind not in _GGUF_NAMES:
        raise ModelLoadError(f"unexpected GGUF tensor {name!r}")
    return f"model.layers.{layer}.{_GGUF_NAMES[kind]}.{suffix}"


def unpermute_rope(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Undo llama.cpp's convert-time permutation of Q/K rows (interleaved -> rotate-half)."""
    rows = w.shape[0]
    return w.reshape(n_heads, rows // n_heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _read_gguf(path: Path) -> tuple[ModelConfig, Iterator[tuple[str, torch.Tensor]], Tokenizer]:
    import gguf

    reader = gguf.GGUFReader(str(path))
    tokenizer = Tokenizer.from_gguf(reader)
    cfg = gguf_config(reader, path, tokenizer.vocab_size)

    def weights() -> Iterator[tuple[str, torch.Tensor]]:
        for t in reader.tensors:
            # A plain ndarray view: on the memmap subclass every row slice the dequantizer
            # takes runs memmap.__array_finalize__ (a third of the load time).
            raw = t.data.view(np.ndarray)
            w = gguf.quants.dequantize(raw, t.tensor_type).astype(np.float32, copy=False)
            if t.name.endswith("attn_q.weight"):
                w = unpermute_rope(w, cfg.num_heads)
            elif t.name.endswith("attn_k.weight"):
                w = unpermute_rope(w, cfg.num_kv_heads)
            yield _gguf_to_hf_name(t.name), torch.from_numpy(np.array(w, order="C"))

    return cfg, weights(), tokenizer


# ---- Hugging Face directory ----------------------------------------------------------------


def _read_hf_dir(
    path: Path,
) -> tuple[ModelConfig, Iterator[tuple[str, torch.Tensor]], Tokenizer | None]:
    from safetensors import safe_open

    config_file = path / "config.json"
    files = sorted(path.glob("*.safetensors"))
    if not config_file.is_file() or not files:
        raise ModelLoadError(f"{path}: expected config.json and *.safetensors files in it")
    hf = json.loads(config_file.read_text())
    if hf.get("rope_scaling"):
        raise ModelLoadError(f"{path}: RoPE scaling {hf['rope_scaling']} is not supported yet")
    eos = None
    gen_file = path / "generation_config.json"
    if gen_file.is_file():
        eos = json.loads(gen_file.read_text()).get("eos_token_id")
    cfg = ModelConfig.from_hf(hf, eos)
    tokenizer = Tokenizer.from_hf_dir(path) if (path / "tokenizer.json").is_file() else None

    def weights() -> Iterator[tuple[str, torch.Tensor]]:
        for f in files:
            with safe_open(str(f), framework="pt") as st:
                for name in st.keys():  # noqa: SIM118 (safe_open is not a dict)
                    yield name, st.get_tensor(name)

    return cfg, weights(), tokenizer
