"""Which tokenizer `bench run` builds prompts with. Explicit, never by a silent fallback:
`--tokenizer`; else the model's own (a packaged name or a path that exists here); else, for
an external server, the model path the server reports (vLLM's and SGLang's /v1/models `root`,
llama.cpp's /props `model_path`, SGLang's tokenizer path) when it can be read here; else a
refusal naming --tokenizer. A relative model id (llama-server reports its -m path as given)
is read from this working directory, which need not be the server's: the refusal says so."""

from __future__ import annotations

import functools
import os
from typing import Any

from rich.console import Console
from rich.markup import escape

from loadgen.config import RunConfig
from loadgen.redact import printable, redact_url
from loadgen.server_info import ServerInfo

DEFAULT_TOKENIZER = "smollm2-135m"  # the bundled engine's default model's


@functools.lru_cache(maxsize=4)  # a sweep asks for the same one at every point
def cached_tokenizer(name: str) -> Any:
    from engine.model.sources import load_tokenizer

    return load_tokenizer(name)


def _try(name: str | None) -> Any:
    from engine.model.sources import ModelLoadError

    if not name:
        return None
    try:
        return cached_tokenizer(name)
    except ModelLoadError:
        return None


def resolve_tokenizer(
    cfg: RunConfig, server: ServerInfo | None, console: Console
) -> tuple[Any, str]:
    """The tokenizer and the name config.json records for it."""
    if cfg.tokenizer:
        tok = cached_tokenizer(cfg.tokenizer)  # a bad name or path: its own clear error
        if tok is None:
            raise ValueError(f"{cfg.tokenizer!r} has no tokenizer")
        return tok, cfg.tokenizer
    assert cfg.model is not None
    if (tok := _try(cfg.model)) is not None:
        return tok, cfg.model
    if not cfg.base_url:  # ours (a tiny random config without one): ours is what it runs
        return cached_tokenizer(DEFAULT_TOKENIZER), DEFAULT_TOKENIZER
    reported = server.model_path if server is not None else None
    if reported and reported != cfg.model and (tok := _try(reported)) is not None:
        console.print(
            f"tokenizer: {escape(printable(reported))}'s, the model path the server reports",
            highlight=False,
        )
        return tok, reported
    where = f"; the server reports {reported!r}, not readable here either" if reported else ""
    if server is not None and not server.listed:
        where = f"; {redact_url(cfg.base_url)}/models did not answer to say more"
    relative = not os.path.isabs(os.path.expanduser(cfg.model)) and (
        os.sep in cfg.model or cfg.model.endswith(".gguf")
    )
    cwd = f" (a relative path is read from this directory, {os.getcwd()})" if relative else ""
    raise ValueError(
        f"no tokenizer for model {printable(cfg.model)!r}: not a packaged model or a file "
        f"here{cwd}{where}. Pass --tokenizer NAME|PATH (a .gguf file, a tokenizer.json or a "
        f"folder holding one; --tokenizer {DEFAULT_TOKENIZER} builds prompts with ours, and "
        "token counts then come from the server's usage)"
    )
