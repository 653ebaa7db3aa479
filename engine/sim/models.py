"""Model shapes a simulation can take without weights: the bundled and tiny models, any
Hugging Face config.json (a file or its directory), and built-in Llama 3.1 configs under
their Hugging Face names."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from engine.config import ModelConfig

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
        from engine.model.loader import _read_gguf

        return _read_gguf(path)[0]
    known = ", ".join(sorted(BUILTIN_CONFIGS))
    raise ValueError(f"model {name!r}: expected a config.json, a .gguf file or one of {known}")
