"""One record per request, appended to requests.jsonl as the request ends (flushed to the OS
within 50 ms), so an interrupted or crashed run keeps every record it had."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import chain, repeat
from pathlib import Path
from typing import Any, TextIO

import numpy as np


@dataclass(slots=True)
class RequestRecord:
    """Times are seconds on `time.perf_counter()`'s clock, relative to the run's start."""

    index: int
    request_id: str
    input_len: int  # asked for (our tokenizer's count of the prompt)
    output_len: int  # asked for (max_tokens)
    warmup: bool = False
    scheduled_s: float = math.nan  # when the arrival process said to send
    queue_s: float = 0.0  # waiting for a free slot under a concurrency cap
    send_s: float | None = None  # the request actually left
    first_chunk_s: float | None = None  # first chunk carrying text or tokens
    end_s: float | None = None
    chunk_s: list[float] = field(default_factory=list)  # every chunk that carried output
    chunk_tokens: list[int] = field(default_factory=list)  # tokens in each of those chunks
    chunk_choice: list[int] = field(default_factory=list)  # n > 1: each chunk's choice index
    prompt_tokens: int | None = None
    cached_tokens: int | None = None  # of those, served by the server's prefix cache (usage)
    prompt_tokens_source: str = "tokenizer"  # usage | tokenizer | engine
    # The server's count minus the asked length (single-turn, counted by the server): what its
    # chat template (a system prompt, role markers) or a BOS added to the prompt we built.
    prompt_tokens_added: int | None = None
    output_tokens: int = 0
    output_tokens_source: str = "chunks"  # usage | tokenizer | chunks | engine
    status: str = "pending"  # ok | error | cancelled
    http_status: int | None = None
    error: str | None = None
    finish_reason: str | None = None
    session: int | None = None  # multi-turn: the conversation, and this request's turn (0..)
    turn: int | None = None
    cls: str | None = None  # its traffic class, when the run mixes several
    n: int = 1  # completions asked for: output_tokens counts them all
    worker: int | None = None  # --workers N: the worker process that sent it (None: one)
    reply: str = ""  # multi-turn: the text received, the next turn's context (not on disk)

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def schedule_lag_s(self) -> float | None:
        """How late the client sent it, not counting a deliberate wait for a slot."""
        if self.send_s is None or math.isnan(self.scheduled_s):
            return None
        return self.send_s - self.scheduled_s - self.queue_s

    def gaps(self) -> list[tuple[float, int]]:
        """(gap, tokens of the later chunk) between successive chunks of one sequence. With
        n > 1 the choices stream interleaved: a gap between two choices' chunks is no
        inter-token latency, so gaps are taken within each choice's own chunks."""
        times, tokens = self.chunk_s, self.chunk_tokens
        if len(tokens) != len(times):  # a record made by hand, or cut before its count
            tokens = [1] * len(times)
        if len(self.chunk_choice) != len(times):  # one sequence (or choices not told apart)
            return [(b - a, n) for a, b, n in zip(times, times[1:], tokens[1:], strict=False)]
        out, last = [], {}
        for t, n, choice in zip(times, tokens, self.chunk_choice, strict=True):
            if choice in last:
                out.append((t - last[choice], n))
            last[choice] = t
        return out

    def itl_s(self) -> np.ndarray:
        """The gaps of `gaps()` alone, as an array: a long run holds tens of millions (8
        bytes each here, 32 as Python floats)."""
        if len(self.chunk_choice) != len(self.chunk_s):  # one sequence: successive chunks
            return np.diff(np.asarray(self.chunk_s, dtype=np.float64))
        return np.asarray([gap for gap, _ in self.gaps()], dtype=np.float64)

    @property
    def tokens_per_sequence(self) -> float:
        """Output tokens of one completion (of n): what TPOT divides by."""
        return self.output_tokens / max(self.n, 1)

    def to_json(self, times_text: str | None = None) -> str:
        """One line; token times to the microsecond (%.6f: a third of the time JSON's shortest
        round-trip repr takes, and a simulated hour writes ~50 million of them). times_text:
        chunk_s as that JSON list already (`TimeTexts`)."""
        d = {name: getattr(self, name) for name in _FIELDS}  # asdict deep-copies: slow
        if math.isnan(self.scheduled_s):
            d["scheduled_s"] = None
        if d["worker"] is None:  # one process: its lines as they always were
            del d["worker"]
        times, tokens = d.pop("chunk_s"), d.pop("chunk_tokens")
        n = len(tokens)
        tokens_text = _ones(n) if tokens.count(1) == n else json.dumps(tokens).replace(" ", "")
        return (
            f'{{"chunk_s":{_times_text(times, times_text)},"chunk_tokens":{tokens_text},'
            + _compact.encode(d)[1:]
        )

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RequestRecord:
        return cls(**{k: v for k, v in d.items() if k in _NAMES})


@dataclass(frozen=True, slots=True)
class TokenTimes:
    """Every chunk of many records in one array (a simulated hour: ~50 million), so that the
    summary and the report take pooled ITLs and token counts without a Python loop a token."""

    times: np.ndarray  # each record's chunk_s, one after another
    tokens: np.ndarray | None  # their chunk_tokens; None: one token each (the common case)
    counts: np.ndarray  # chunks per record

    @classmethod
    def of(cls, records: Sequence[RequestRecord]) -> TokenTimes:
        counts = np.fromiter(map(len, (r.chunk_s for r in records)), np.int64, len(records))
        total = int(counts.sum())
        times = np.fromiter(chain.from_iterable(r.chunk_s for r in records), np.float64, total)
        tokens = None
        told = [len(r.chunk_tokens) == len(r.chunk_s) for r in records]
        if any(
            t and r.chunk_tokens.count(1) != len(r.chunk_tokens)
            for t, r in zip(told, records, strict=True)
        ):
            tokens = np.fromiter(
                chain.from_iterable(
                    r.chunk_tokens if t else repeat(1, len(r.chunk_s))
                    for t, r in zip(told, records, strict=True)
                ),
                np.float64,
                total,
            )
        return cls(times, tokens, counts)

    def gaps(self, records: Sequence[RequestRecord]) -> np.ndarray:
        """`itl_s()` of each of these records (those `of` was built from), pooled."""
        starts = np.cumsum(self.counts) - self.counts
        within = np.ones(max(len(self.times) - 1, 0), dtype=bool)
        later = starts[(starts > 0) & (starts < len(self.times))]
        within[later - 1] = False  # a gap from one record's last chunk to the next's first
        # n > 1 with choices told apart: gaps within each choice's chunks, record by record
        choices = [
            i
            for i, r in enumerate(records)
            if r.chunk_choice and len(r.chunk_choice) == len(r.chunk_s)
        ]
        for i in choices:
            within[starts[i] : starts[i] + max(self.counts[i] - 1, 0)] = False
        pooled = np.diff(self.times)[within]
        if not choices:  # the common case: no copy of an hour's 46 M gaps
            return pooled
        return np.concatenate([pooled, *(records[i].itl_s() for i in choices)])


_NAMES = frozenset(f.name for f in dataclasses.fields(RequestRecord))


class TimeTexts(dict[str, tuple[int, str]]):
    """Finished records' token times as their JSON list, made by whoever stamped them: a
    simulation stamps every running request at the same step ends, formats each end once and
    keeps each request's texts as it goes, so its line joins them instead of formatting or
    looking up each of an hour's ~46 million times. request id -> (how many times, the list)."""

    def take(self, rec: RequestRecord) -> str | None:
        """The record's list, if one was made for exactly its times."""
        made = self.pop(rec.request_id, None)
        return made[1] if made is not None and made[0] == len(rec.chunk_s) else None


def _times_text(times: list[float], text: str | None) -> str:
    """`times` as a JSON list to the microsecond (`text`: made already)."""
    return text if text is not None else _micros(len(times)) % tuple(times)


_compact = json.JSONEncoder(separators=(",", ":"))


TIME_FORMAT = "%.6f"  # a token time in requests.jsonl: to the microsecond


@functools.cache
def _micros(n: int) -> str:
    """The format of a JSON list of n times to the microsecond."""
    return "[" + ",".join([TIME_FORMAT] * n) + "]"


@functools.cache
def _ones(n: int) -> str:
    return "[" + ",".join(["1"] * n) + "]"


_FIELDS = tuple(f.name for f in dataclasses.fields(RequestRecord) if f.name != "reply")


class RecordWriter:
    """Appends one JSON line per record. Inside an event loop the lines are flushed to the OS
    within FLUSH_S (a few hundred records a batch at high rates, not a syscall each); on close,
    on Ctrl-C and on any exception the rest is flushed, so only a SIGKILL can lose the last
    FLUSH_S of records."""

    FLUSH_S = 0.05

    def __init__(self, path: Path, time_texts: TimeTexts | None = None) -> None:
        """time_texts: records' token times formatted beforehand (a simulated engine's)."""
        self.path = path
        self._f: TextIO = path.open("a", encoding="utf-8")
        self._flush_pending = False
        self.time_texts = time_texts

    def write(self, rec: RequestRecord) -> None:
        texts = self.time_texts
        self._f.write(rec.to_json(texts.take(rec) if texts is not None else None) + "\n")
        if self._flush_pending:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self._f.flush()
            return
        self._flush_pending = True
        loop.call_later(self.FLUSH_S, self._flush)

    def _flush(self) -> None:
        self._flush_pending = False
        if not self._f.closed:
            self._f.flush()

    def close(self) -> None:
        self._f.close()


def read_records(path: Path) -> list[RequestRecord]:
    out = []
    with path.open(encoding="utf-8") as f:
        for line in f:
            if line.strip():
                d = json.loads(line)
                d["scheduled_s"] = math.nan if d.get("scheduled_s") is None else d["scheduled_s"]
                out.append(RequestRecord.from_dict(d))
    return out
