"""One record per request, appended to requests.jsonl the moment the request ends, so an
interrupted or crashed run keeps every record it had."""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO


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
    prompt_tokens: int | None = None
    prompt_tokens_source: str = "tokenizer"  # usage | tokenizer | engine
    output_tokens: int = 0
    output_tokens_source: str = "chunks"  # usage | tokenizer | chunks | engine
    status: str = "pending"  # ok | error | cancelled
    http_status: int | None = None
    error: str | None = None
    finish_reason: str | None = None

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def schedule_lag_s(self) -> float | None:
        """How late the client sent it, not counting a deliberate wait for a slot."""
        if self.send_s is None or math.isnan(self.scheduled_s):
            return None
        return self.send_s - self.scheduled_s - self.queue_s

    def to_json(self) -> str:
        d = dataclasses.asdict(self)
        return json.dumps({k: _round(v) for k, v in d.items()}, separators=(",", ":"))

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RequestRecord:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


def _round(v: Any) -> Any:
    """Nanosecond resolution is plenty and keeps the file small."""
    if isinstance(v, float):
        return None if math.isnan(v) else round(v, 9)
    if isinstance(v, list) and v and isinstance(v[0], float):
        return [round(x, 9) for x in v]
    return v


class RecordWriter:
    """Appends one JSON line per record and flushes it to the OS at once: a killed process
    loses nothing it had written."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._f: TextIO = path.open("a", encoding="utf-8")

    def write(self, rec: RequestRecord) -> None:
        self._f.write(rec.to_json() + "\n")
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
