"""Model shapes without weights: the bundled and tiny models, any Hugging Face config.json (a
file or its directory), a GGUF file's metadata, and built-in Llama 3.1 configs under their
Hugging Face names. What a simulation and a dummy-weight load take; torch-free."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from engine.config import ModelConfig
from engine.model.sources import ModelLoadError

_LLAMA_31_8B = ModelConfig(
    vocab_size=128256,
    hidden_size=4096,
    intermediate_size=14336,
    num_layers=32,
    num_heads=32,
    num_kv_heads=8,
    head_dim=128,
    rope_theta=500000.0,
    rms_norm_eps=1e-5,
    max_position_embeddings=131072,
    tie_word_embeddings=False,
    bos_token_id=128000,
    eos_token_ids=(128001,),
)
# Shapes from the models' published config.json files (no weights are needed).
BUILTIN_CONFIGS: dict[str, ModelConfig] = {
    "meta-llama/Llama-3.1-8B": _LLAMA_31_8B,
    "meta-llama/Llama-3.1-70B": replace(
        _LLAMA_31_8B, hidden_size=8192, intermediate_size=28672, num_layers=80, num_heads=64
    ),
}
for _name in list(BUILTIN_CONFIGS):  # the Instruct models and Llama 3 share the shapes
    BUILTIN_CONFIGS[f"{_name}-Instruct"] = BUILTIN_CONFIGS[_name]
    BUILTIN_CONFIGS[_name.replace("3.1", "3")] = replace(
        BUILTIN_CONFIGS[_name], max_position_embeddings=8192, rope_theta=500000.0
    )


def model_shape(name: str) -> ModelConfig:
    """The shape of `name`: a built-in config, a config.json or a directory holding one, a
    tiny config, or a model the engine can load (its GGUF metadata; no weights are read)."""
    if name in BUILTIN_CONFIGS:
        return BUILTIN_CONFIGS[name]
    path = Path(name).expanduser()
    config_file = path / "config.json" if path.is_dir() else path
    if config_file.suffix == ".json" and config_file.is_file():
        try:
            return ModelConfig.from_hf(json.loads(config_file.read_text()))
        except (ValueError, KeyError, TypeError) as e:
            raise ValueError(f"{config_file}: not a Llama-style config.json ({e!r})") from None
    from engine.model.sources import TINY_CONFIGS, resolve_model_path

    if name in TINY_CONFIGS:
        return TINY_CONFIGS[name]
    path = resolve_model_path(name)  # a packaged model or a .gguf file: its metadata only
    if path.suffix == ".gguf":
        import gguf

        reader = gguf.GGUFReader(str(path))
        return gguf_config(reader, path, len(reader.fields["tokenizer.ggml.tokens"].data))
    known = ", ".join(sorted(BUILTIN_CONFIGS))
    raise ValueError(f"model {name!r}: expected a config.json, a .gguf file or one of {known}")


def gguf_config(reader: Any, path: Path, vocab_size: int) -> ModelConfig:
    """A GGUF file's Llama shape from its metadata (a gguf.GGUFReader's); `vocab_size` where
    the metadata leaves it out (its tokenizer's)."""
    meta = {k: f.contents() for k, f in reader.fields.items() if not k.startswith("tokenizer.")}
    arch = meta.get("general.architecture")
    if arch != "llama":
        raise ModelLoadError(f"{path}: architecture {arch!r} is not supported (only 'llama')")
    if f"{arch}.rope.scaling.type" in meta:
        raise ModelLoadError(f"{path}: RoPE scaling is not supported yet")
    heads = meta["llama.attention.head_count"]
    hidden = meta["llama.embedding_length"]
    eos = reader.fields.get("tokenizer.ggml.eos_token_id")
    bos = reader.fields.get("tokenizer.ggml.bos_token_id")
    return ModelConfig(
        vocab_size=meta.get("llama.vocab_size", vocab_size),
        hidden_size=hidden,
        intermediate_size=meta["llama.feed_forward_length"],
        num_layers=meta["llama.block_count"],
        num_heads=heads,
        num_kv_heads=meta.get("llama.attention.head_count_kv", heads),
        head_dim=meta.get("llama.attention.key_length", hidden // heads),
        rope_theta=float(meta.get("llama.rope.freq_base", 10000.0)),
        rms_norm_eps=float(meta["llama.attention.layer_norm_rms_epsilon"]),
        max_position_embeddings=meta["llama.context_length"],
        tie_word_embeddings="output.weight" not in {t.name for t in reader.tensors},
        bos_token_id=bos.contents() if bos else None,
        eos_token_ids=(eos.contents(),) if eos else (),
    )
