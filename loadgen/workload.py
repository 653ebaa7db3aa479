"""What each request asks for: prompts of exact token lengths built from the model's own
vocabulary, output lengths, shared-prefix groups, ShareGPT conversations and trace replays."""

from __future__ import annotations

import itertools
import json
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from loadgen.traces import MOONCAKE_BLOCK_TOKENS, Trace

DEFAULT_INPUT_LEN, DEFAULT_OUTPUT_LEN = "256", "128"  # when neither flag nor profile says


@dataclass(frozen=True, slots=True)
class RequestSpec:
    prompt: str  # the completion prompt, or the user message for chat
    input_len: int  # its tokens (with the conversation before it), counted by our tokenizer
    output_len: int  # max_tokens (with ignore_eos where the server supports it)
    history: tuple[tuple[str, str], ...] = ()  # (role, text) turns before it: multi-turn
    cls: str | None = None  # its traffic class, when the run mixes several
    n: int = 1  # completions asked for this prompt (parallel sampling)
    priority: int | None = None  # lower is served first (vLLM's); None: not sent
    # A synthetic prompt as indices into PromptBuilder.words (uint32: 1 KB a 256-token
    # prompt): a simulation takes its token ids from them instead of tokenizing the text.
    words: np.ndarray | None = field(default=None, compare=False, hash=False, repr=False)

    def messages(self) -> list[dict[str, str]]:
        turns = [*self.history, ("user", self.prompt)]
        return [{"role": role, "content": text} for role, text in turns]

    def text(self) -> str:
        """The completions endpoint's prompt: the conversation's texts run together."""
        return "".join(text for _, text in self.history) + self.prompt


@dataclass(frozen=True, slots=True)
class LengthDist:
    """A token length: fixed `N`, `uniform:lo:hi`, `normal:mean:std` or `lognormal:mean:sigma`
    (mean of the lengths themselves; sigma of the underlying normal). Samples are >= 1."""

    kind: str
    a: float
    b: float = 0.0

    @classmethod
    def parse(cls, text: str | int) -> LengthDist:
        spec = str(text).strip()
        parts = spec.split(":")
        expected = "expected N, uniform:lo:hi, normal:mean:std or lognormal:mean:sigma"
        try:
            if len(parts) == 1:
                kind, a, b = "fixed", float(int(parts[0])), 0.0
            elif len(parts) == 3 and parts[0] == "uniform":  # integer bounds, both included
                kind, a, b = "uniform", float(int(parts[1])), float(int(parts[2]))
            elif len(parts) == 3 and parts[0] in ("normal", "lognormal"):
                kind, a, b = parts[0], float(parts[1]), float(parts[2])
            else:
                raise ValueError
            if not (math.isfinite(a) and math.isfinite(b)):
                raise ValueError
        except ValueError:
            raise ValueError(f"length {spec!r}: {expected}") from None
        return cls._checked(kind, a, b, spec)

    @classmethod
    def _checked(cls, kind: str, a: float, b: float, spec: str) -> LengthDist:
        faults = {
            "fixed": [(a < 1, "a length is >= 1 token")],
            "uniform": [(a < 1, "lo must be >= 1 token"), (a > b, f"lo {a:g} > hi {b:g}")],
            "normal": [(a < 1, "the mean must be >= 1 token"), (b < 0, "std must be >= 0")],
            "lognormal": [(a < 1, "the mean must be >= 1 token"), (b < 0, "sigma must be >= 0")],
        }[kind]
        for bad, why in faults:
            if bad:
                raise ValueError(f"length {spec!r}: {why}")
        return cls(kind, a, b)

    def sample(self, rng: np.random.Generator) -> int:
        if self.kind == "fixed":
            x = self.a
        elif self.kind == "uniform":
            x = rng.integers(int(self.a), int(self.b) + 1)
        elif self.kind == "normal":
            x = rng.normal(self.a, self.b)
        else:
            x = rng.lognormal(math.log(self.a) - self.b**2 / 2, self.b)
        return max(1, round(float(x)))


class PromptBuilder:
    """Random prompts of exactly n tokens. It draws from the vocabulary's " word" tokens (a
    space then letters): the tokenizer splits text before every space, so a string of such
    words encodes back to exactly the same ids, and blocks of them concatenate safely."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        cache = getattr(tokenizer, "derived_cache", None)  # a scan is 0.3-1 s of CPU per run
        ids, words = (
            cache("prompt-words-1", lambda: word_tokens(tokenizer))
            if cache
            else word_tokens(tokenizer)
        )
        self.word_ids = np.asarray(ids, dtype=np.int64)
        self.words = words
        self._word_array = np.asarray(words, dtype=object)  # joins from an index array
        if len(ids) < 100 or not self._concatenates(np.random.default_rng(0)):
            raise ValueError(
                "this tokenizer has too few ' word' tokens that re-encode to themselves to build "
                "exact-length prompts; use a byte-level BPE tokenizer (--tokenizer smollm2-135m)"
            )

    def _concatenates(self, rng: np.random.Generator) -> bool:
        picks = rng.integers(0, len(self.words), 2000)
        text = "".join(self.words[k] for k in picks)
        return (
            self.tokenizer.encode(text, add_special_tokens=False) == self.word_ids[picks].tolist()
        )

    def tokens(self, n: int, rng: np.random.Generator) -> list[int]:
        """n word-token indices into `self.words` (not token ids)."""
        return rng.integers(0, len(self.words), n).tolist()

    def text(self, picks: list[int]) -> str:
        return "".join(map(self.words.__getitem__, picks))

    def draw(self, n: int, rng: np.random.Generator) -> np.ndarray:
        """`tokens` as an array (the same draws): a simulated hour plans 360,000 prompts."""
        return rng.integers(0, len(self.words), n).astype(np.uint32)

    def text_of(self, picks: np.ndarray) -> str:
        return "".join(self._word_array[picks].tolist())

    def prompt(self, n: int, rng: np.random.Generator) -> str:
        return self.text(self.tokens(n, rng))


def word_tokens(tokenizer: Any) -> tuple[list[int], list[str]]:
    """The vocabulary's " word" tokens that encode back to themselves, and their text."""
    ids, words = [], []
    for i in range(tokenizer.vocab_size):
        s = tokenizer.decode([i])
        if re.fullmatch(r" [a-z]{2,}", s) and tokenizer.encode(s, False) == [i]:
            ids.append(i)
            words.append(s)
    return ids, words


@dataclass(frozen=True, slots=True)
class WorkloadConfig:
    input_len: str = "256"
    output_len: str = "128"
    shared_prefix_len: int = 0
    num_prefix_groups: int = 1
    seed: int = 0
    template_tokens: int = 0  # taken off each prompt: what the chat template will add


def synthetic(cfg: WorkloadConfig, builder: PromptBuilder) -> Iterator[RequestSpec]:
    """Endless random requests; with shared prefixes, request i extends group i % G's prefix."""
    rng = np.random.default_rng([cfg.seed, 1])
    inp, out = LengthDist.parse(cfg.input_len), LengthDist.parse(cfg.output_len)
    if cfg.shared_prefix_len < 0 or cfg.num_prefix_groups < 1:
        raise ValueError("shared prefix length must be >= 0 and prefix groups >= 1")
    prefixes = [builder.draw(cfg.shared_prefix_len, rng) for _ in range(cfg.num_prefix_groups)]
    for i in itertools.count():
        n = max(1, inp.sample(rng) - cfg.template_tokens)
        prefix = prefixes[i % len(prefixes)]
        picks = (
            np.concatenate((prefix, builder.draw(n, rng))) if len(prefix) else builder.draw(n, rng)
        )
        yield RequestSpec(builder.text_of(picks), len(picks), out.sample(rng), words=picks)


def from_trace(
    trace: Trace, builder: PromptBuilder, seed: int, output_len: str | None = None
) -> list[RequestSpec]:
    """One request per trace row. Mooncake hash ids become 512-token blocks, the same ids for
    the same hash id in every request, so the trace's prefix sharing is replayed exactly.
    `output_len` (a length spec) replaces the trace's output lengths."""
    blocks: dict[int, list[int]] = {}
    rng = np.random.default_rng([seed, 2])
    out_rng = np.random.default_rng([seed, 4])  # the prompts stay those of the trace alone
    fixed_out = LengthDist.parse(output_len) if output_len is not None else None
    specs = []
    for row in trace.rows:
        if row.hash_ids:
            picks: list[int] = []
            for h in row.hash_ids:
                if h not in blocks:
                    blocks[h] = builder.tokens(MOONCAKE_BLOCK_TOKENS, rng)
                picks += blocks[h]
            picks = picks[: row.input_len]
        else:
            picks = builder.tokens(row.input_len, rng)
        n_out = fixed_out.sample(out_rng) if fixed_out else row.output_len
        specs.append(RequestSpec(builder.text(picks), len(picks), n_out))
    return specs


@dataclass(frozen=True, slots=True)
class ShareGPT:
    """A ShareGPT file's usable (prompt, prompt tokens, reply tokens) pairs, and what was
    dropped: a run must say how much of the file it used and how often it repeats it."""

    path: str
    pairs: list[tuple[str, int, int]]
    conversations: int
    single_turn: int = 0  # fewer than two turns
    too_short: int = 0  # prompt or reply under 4 tokens
    too_long: int = 0  # prompt over 1024 tokens, or prompt + reply over 2048
    dialogues: list[tuple[tuple[str, int, int], ...]] = field(default_factory=list)

    def describe(self, num_requests: int | None) -> str:
        dropped = self.conversations - len(self.pairs)
        text = f"dataset {self.path}: {len(self.pairs)} of {self.conversations} conversations used"
        if dropped:
            text += (
                f" ({dropped} dropped as vLLM drops them: {self.single_turn} single-turn, "
                f"{self.too_short} under 4 tokens, {self.too_long} over 1024/2048 tokens)"
            )
        if num_requests is not None and num_requests > len(self.pairs):
            reuse = num_requests / len(self.pairs)
            text += f"; {num_requests} requests reuse each about {reuse:.1f} times"
        return text

    def as_dict(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "conversations": self.conversations,
            "used": len(self.pairs),
            "dropped_single_turn": self.single_turn,
            "dropped_too_short": self.too_short,
            "dropped_too_long": self.too_long,
        }


def read_sharegpt(path: str | Path, tokenizer: Any, dialogues: bool = False) -> ShareGPT:
    """First user turn as the prompt, the reply's length as the output length; like vLLM,
    drops pairs under 4 tokens, prompts over 1024 and pairs over 2048 tokens. With
    `dialogues`, every usable conversation's turns too (up to its first unusable pair)."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"dataset {path}: not a readable JSON file: {e}") from e
    if not isinstance(data, list):
        raise ValueError(f"dataset {path}: expected a JSON list of conversations")
    pairs: list[tuple[str, int, int]] = []
    found: list[tuple[tuple[str, int, int], ...]] = []
    single = short = long = 0
    for k, item in enumerate(data):
        turns = item.get("conversations", item.get("messages")) if isinstance(item, dict) else None
        if not isinstance(turns, list):
            raise ValueError(f"dataset {path}: entry {k} has no 'conversations' list")
        if len(turns) < 2:
            single += 1
            continue
        try:
            prompt, reply = (t.get("value", t.get("content")) for t in turns[:2])
        except AttributeError:
            raise ValueError(f"dataset {path}: entry {k}: a turn is not an object") from None
        if not isinstance(prompt, str) or not isinstance(reply, str):
            raise ValueError(f"dataset {path}: entry {k}: a turn has no 'value' text")
        n_in = len(tokenizer.encode(prompt, add_special_tokens=False))
        n_out = len(tokenizer.encode(reply, add_special_tokens=False))
        if n_in < 4 or n_out < 4:
            short += 1
        elif n_in > 1024 or n_in + n_out > 2048:
            long += 1
        else:
            pairs.append((prompt, n_in, n_out))
            if dialogues:
                found.append(((prompt, n_in, n_out), *_later_turns(turns, tokenizer)))
    if not pairs:
        raise ValueError(f"dataset {path}: no usable conversation (need two turns of 4+ tokens)")
    return ShareGPT(str(path), pairs, len(data), single, short, long, found)


def _later_turns(turns: list[Any], tokenizer: Any) -> list[tuple[str, int, int]]:
    """A conversation's (user, reply) pairs after the first, up to the first unusable one."""
    out = []
    for k in range(2, len(turns) - 1, 2):
        texts = [
            t.get("value", t.get("content")) if isinstance(t, dict) else None
            for t in turns[k : k + 2]
        ]
        if not all(isinstance(text, str) for text in texts):
            break
        n_in, n_out = (len(tokenizer.encode(text, add_special_tokens=False)) for text in texts)
        if n_in < 4 or n_out < 4 or n_in > 1024:
            break
        out.append((texts[0], n_in, n_out))
    return out


def sharegpt(data: ShareGPT, seed: int, output_len: str | None = None) -> Iterator[RequestSpec]:
    """Endless requests from the pairs, in a fresh seeded shuffle each pass; `output_len` (a
    length spec) replaces the replies' lengths."""
    fixed_out = LengthDist.parse(output_len) if output_len is not None else None
    rng = np.random.default_rng([seed, 3])
    while True:
        for k in rng.permutation(len(data.pairs)):
            prompt, n_in, n_out = data.pairs[k]
            yield RequestSpec(prompt, n_in, fixed_out.sample(rng) if fixed_out else n_out)


def chat_template_tokens(builder: PromptBuilder) -> int:
    """What the tokenizer's chat template adds to a one-message chat prompt (SmolLM2's: a
    system prompt and role markers, 30 tokens): as the server counts it when it applies the
    same model's template, as llama.cpp and vLLM do by default."""
    tok = builder.tokenizer
    if not getattr(tok, "chat_template", None):
        raise ValueError(
            "--input-len-after-template needs a tokenizer with a chat template (--tokenizer)"
        )
    text = builder.text(builder.tokens(16, np.random.default_rng(0)))
    messages = [{"role": "user", "content": text}]
    return len(tok.encode_chat(messages)) - len(tok.encode(text, add_special_tokens=False))
