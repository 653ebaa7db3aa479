"""Tokenizers built with the `tokenizers` library, from GGUF metadata (byte-level BPE from
its vocab and merges) or a tokenizer.json; chat templates rendered with jinja2."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers
from tokenizers import Tokenizer as HFTokenizer

# llama.cpp's pre-tokenizer names -> the Hugging Face pre-tokenizer they stand for.
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_GGUF_CONTROL, _GGUF_USER_DEFINED = 3, 4


def _gguf_pre_tokenizer(name: str) -> pre_tokenizers.PreTokenizer:
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if name in ("smollm", "starcoder"):  # llama.cpp: split off every \p{N}, then GPT-2's regex
        return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    if name in ("gpt2", "default"):
        return byte_level
    if name in ("llama-bpe", "llama3"):
        return pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(_LLAMA3_SPLIT), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    raise ValueError(f"GGUF pre-tokenizer {name!r} is not supported")


LONG_TEXT_CHARS = 10_000  # from here on a text is encoded with the GIL released


class Tokenizer:
    def __init__(
        self,
        tokenizer: HFTokenizer,
        eos_token_ids: tuple[int, ...] = (),
        bos_token_id: int | None = None,
        add_bos: bool = False,
        chat_template: str | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.eos_token_ids = eos_token_ids
        self.bos_token_id = bos_token_id
        self.add_bos = add_bos and bos_token_id is not None
        self.chat_template = chat_template
        # derived_cache(name, compute): compute() once per model file, kept on disk; set by
        # engine/model/sources.py where the tokenizer has a cache entry (else None).
        self.derived_cache: Callable[[str, Callable[[], Any]], Any] | None = None

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Thread-friendly for long texts: `encode_batch` releases the GIL (`encode` holds it,
        so a server tokenizing on a worker thread would still stall its event loop)."""
        check_unicode(text)
        if len(text) < LONG_TEXT_CHARS:
            ids = self.tokenizer.encode(text, add_special_tokens=False).ids
        else:
            ids = self.tokenizer.encode_batch([text], add_special_tokens=False)[0].ids
        if add_special_tokens and self.add_bos:
            ids = [self.bos_token_id, *ids]
        return ids

    @functools.cached_property
    def max_token_chars(self) -> int | None:
        """The most characters any one token stands for; None where a normalizer may drop
        characters, so that no bound on a text's token count follows from its length."""
        if self.tokenizer.normalizer is not None:
            return None
        size = self.tokenizer.get_vocab_size(with_added_tokens=True)
        most = max(len(self.tokenizer.decode([i], skip_special_tokens=False)) for i in range(size))
        return most + 1  # a decoder may strip the leading space of a lone token

    def min_num_tokens(self, num_chars: int) -> int:
        """A certain lower bound on the token count of any text of `num_chars` characters,
        without encoding it (0 where none is known)."""
        most = self.max_token_chars
        return -(-num_chars // most) if most else 0

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)

    def token_to_str(self, token_id: int) -> str | None:
        return self.tokenizer.id_to_token(token_id)

    def apply_chat_template(
        self, messages: list[dict[str, Any]], add_generation_prompt: bool = True
    ) -> str:
        if not self.chat_template:
            raise ValueError("this model has no chat template")
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)

        def raise_exception(message: str) -> None:
            raise ValueError(message)

        env.globals["raise_exception"] = raise_exception
        template = env.from_string(self.chat_template)
        special = {
            "bos_token": self._token_or_empty(self.bos_token_id),
            "eos_token": self._token_or_empty(
                self.eos_token_ids[0] if self.eos_token_ids else None
            ),
        }
        return template.render(
            messages=messages, add_generation_prompt=add_generation_prompt, **special
        )

    def encode_chat(
        self, messages: list[dict[str, Any]], add_generation_prompt: bool = True
    ) -> list[int]:
        """The chat prompt's token ids. The template writes its own special tokens (a BOS
        among them, where it wants one), so none is added on top: as transformers'
        `apply_chat_template(tokenize=True)` and vLLM's chat endpoint do."""
        text = self.apply_chat_template(messages, add_generation_prompt)
        return self.encode(text, add_special_tokens=False)

    def _token_or_empty(self, token_id: int | None) -> str:
        return "" if token_id is None else self.tokenizer.id_to_token(token_id) or ""

    @classmethod
    def from_gguf(cls, reader: Any) -> Tokenizer:
        fields = reader.fields

        def get(key: str, default: Any = None) -> Any:
            return fields[key].contents() if key in fields else default

        kind = get("tokenizer.ggml.model")
        if kind != "gpt2":
            raise ValueError(f"GGUF tokenizer model {kind!r} is not supported (only 'gpt2' BPE)")
        tokens: list[str] = get("tokenizer.ggml.tokens")
        merges = [tuple(m.split(" ", 1)) for m in get("tokenizer.ggml.merges")]
        vocab = {tok: i for i, tok in enumerate(tokens)}
        tk = HFTokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False))
        tk.pre_tokenizer = _gguf_pre_tokenizer(get("tokenizer.ggml.pre", "default"))
        tk.decoder = decoders.ByteLevel()
        types = get("tokenizer.ggml.token_type", [])
        special = [
            AddedToken(tokens[i], special=True, normalized=False)
            for i, t in enumerate(types)
            if t in (_GGUF_CONTROL, _GGUF_USER_DEFINED)
        ]
        tk.add_special_tokens(special)
        eos = get("tokenizer.ggml.eos_token_id")
        return cls(
            tk,
            eos_token_ids=() if eos is None else (eos,),
            bos_token_id=get("tokenizer.ggml.bos_token_id"),
            add_bos=bool(get("tokenizer.ggml.add_bos_token", False)),
            chat_template=get("tokenizer.chat_template"),
        )

    def to_json(self) -> str:
        """Everything `from_json` needs to rebuild this tokenizer: HF's tokenizer.json and our
        special-token settings (the GGUF tokenizer's cache, engine/model/sources.py)."""
        return json.dumps(
            {
                "tokenizer_json": self.tokenizer.to_str(),
                "eos_token_ids": list(self.eos_token_ids),
                "bos_token_id": self.bos_token_id,
                "add_bos": self.add_bos,
                "chat_template": self.chat_template,
            }
        )

    @classmethod
    def from_json(cls, text: str) -> Tokenizer:
        data = json.loads(text)
        return cls(
            HFTokenizer.from_str(data["tokenizer_json"]),
            eos_token_ids=tuple(data["eos_token_ids"]),
            bos_token_id=data["bos_token_id"],
            add_bos=data["add_bos"],
            chat_template=data["chat_template"],
        )

    @classmethod
    def from_hf_dir(cls, path: Path) -> Tokenizer:
        tk = HFTokenizer.from_file(str(path / "tokenizer.json"))
        cfg_file = path / "tokenizer_config.json"
        cfg = json.loads(cfg_file.read_text()) if cfg_file.is_file() else {}

        def token_id(key: str) -> int | None:
            tok = cfg.get(key)
            if isinstance(tok, dict):
                tok = tok.get("content")
            return tk.token_to_id(tok) if tok else None

        eos = token_id("eos_token")
        return cls(
            tk,
            eos_token_ids=() if eos is None else (eos,),
            bos_token_id=token_id("bos_token"),
            add_bos=bool(cfg.get("add_bos_token", False)),
            chat_template=cfg.get("chat_template"),
        )


def check_unicode(text: str) -> None:
    """Raise ValueError for text no tokenizer can take: a lone UTF-16 surrogate (JSON's
    "\\ud800" escape decodes to one) is a str in Python but not Unicode text."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(f"the text is not valid Unicode at character {e.start}: {e.reason}") from e


class IncrementalDetokenizer:
    """Turns a growing list of token ids into text deltas without re-decoding everything
    and without emitting half of a multi-byte character (vLLM's prefix/read offsets)."""

    def __init__(self, tokenizer: Tokenizer, prompt_ids: list[int]) -> None:
        self.tokenizer = tokenizer
        # Start a few tokens back into the prompt so the first word decodes with its space.
        self.prefix_offset = max(len(prompt_ids) - 5, 0)
        self.read_offset = len(prompt_ids)

    def step(self, all_ids: list[int], final: bool = False) -> str:
        """The new text since the last call; `final` also flushes an incomplete character."""
        prefix = self.tokenizer.decode(all_ids[self.prefix_offset : self.read_offset])
        full = self.tokenizer.decode(all_ids[self.prefix_offset :])
        if len(full) > len(prefix) and (final or not full.endswith("\ufffd")):
            self.prefix_offset, self.read_offset = self.read_offset, len(all_ids)
            return full[len(prefix) :]
        return ""
