"""Readers of public LLM-serving request traces (Mooncake JSONL, Azure LLM inference CSV,
BurstGPT CSV) and of our own JSONL, all into the same `TraceRow`s, so that arrivals replay a
trace's timing and workloads its lengths whatever its source. A malformed row stops the read,
naming file, line and field: a silently dropped row would change the load being measured."""

from __future__ import annotations

import contextlib
import csv
import json
import math
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

TRACE_FORMATS = ("mooncake", "azure", "burstgpt", "jsonl")
MOONCAKE_BLOCK_TOKENS = 512  # Mooncake's hash_ids name 512-token prompt blocks, the last partial

# CSV formats: the columns a header must have, the timestamp first.
_CSV_COLUMNS = {
    "azure": ("TIMESTAMP", "ContextTokens", "GeneratedTokens"),
    "burstgpt": ("Timestamp", "Model", "Request tokens", "Response tokens"),
}


class TraceError(ValueError):
    """A malformed trace: the message names the file, the line number and what was wrong."""


@dataclass(frozen=True, slots=True)
class TraceRow:
    timestamp_s: float  # seconds since the trace's first kept row (which is 0.0)
    input_len: int  # prompt tokens
    output_len: int  # output tokens
    hash_ids: tuple[int, ...] = ()  # Mooncake only: ids of 512-token prompt blocks
    line: int = 0  # 1-based line number in the file


@dataclass(slots=True)
class Trace:
    rows: list[TraceRow]
    skipped_failed: int = 0  # BurstGPT rows with Response tokens == 0
    skipped_model: int = 0  # BurstGPT rows filtered out by the model filter
    path: str = ""
    format: str = ""


class _RowError(Exception):
    """What is wrong with one row; `read_trace` adds the file and line."""


# (absolute timestamp in seconds, input_len, output_len, hash_ids, model name or None)
_Parsed = tuple[float, int, int, tuple[int, ...], str | None]
_Records = Iterator[tuple[int, dict[str, Any]]]  # (1-based line, record)


def read_trace(path: str | Path, fmt: str, model: str | None = None) -> Trace:
    """Read a whole trace of format `fmt`; `model` keeps only that BurstGPT model's rows.

    Rows must be in time order (replay needs it; a sort would hide a corrupt file). BurstGPT rows
    are filtered by model first, then failed ones (Response tokens 0) are dropped and counted.
    """
    if fmt not in TRACE_FORMATS:
        raise TraceError(f"unknown trace format {fmt!r}: use one of {', '.join(TRACE_FORMATS)}")
    if model is not None and fmt != "burstgpt":
        raise TraceError(f"a model filter applies to burstgpt traces only, not to {fmt!r}")
    name = str(path)
    try:
        # utf-8-sig: CSV exports often start with a byte-order mark that would rename column 1.
        with open(path, encoding="utf-8-sig", newline="") as f:
            return _read(f, name, fmt, model)
    except FileNotFoundError:
        raise TraceError(f"trace {name}: no such file") from None
    except UnicodeDecodeError:
        raise TraceError(f"trace {name}: not UTF-8 text") from None
    except OSError as e:
        raise TraceError(f"trace {name}: cannot read: {e.strerror}") from None


def _read(f: TextIO, name: str, fmt: str, model: str | None) -> Trace:
    parse = _PARSERS[fmt]
    columns = _CSV_COLUMNS.get(fmt)
    records = _json_records(f, name) if columns is None else _csv_records(f, name, columns)
    trace = Trace(rows=[], path=name, format=fmt)
    start: float | None = None
    previous: tuple[float, int] | None = None  # (timestamp, line) of the last row read
    for line, record in records:
        try:
            ts, input_len, output_len, hash_ids, row_model = parse(record)
            if previous is not None and ts < previous[0]:
                key = columns[0] if columns else "timestamp"
                raise _RowError(f"{key!r} is earlier than line {previous[1]}'s (out of order)")
        except _RowError as e:
            raise _error(name, line, str(e)) from None
        previous = (ts, line)
        if model is not None and row_model != model:
            trace.skipped_model += 1
        elif fmt == "burstgpt" and output_len == 0:
            trace.skipped_failed += 1
        else:
            start = ts if start is None else start
            trace.rows.append(TraceRow(ts - start, input_len, output_len, hash_ids, line))
    if not trace.rows:
        skipped = f" ({trace.skipped_failed} failed, {trace.skipped_model} of other models)"
        raise TraceError(f"trace {name}: no requests" + (skipped if previous else " (no rows)"))
    return trace


def _error(name: str, line: int, message: str) -> TraceError:
    return TraceError(f"trace {name}, line {line}: {message}")


def _json_records(f: TextIO, name: str) -> _Records:
    for line, text in enumerate(f, start=1):
        if not text.strip():
            continue
        text = text.rstrip("\r\n")  # else a cut line's error points at column 1 of "line 2"
        try:
            record = json.loads(text)
        except json.JSONDecodeError as e:
            where = "the line ends early" if e.pos >= len(text.rstrip()) else f"column {e.colno}"
            raise _error(name, line, f"bad JSON: {e.msg} ({where})") from None
        if not isinstance(record, dict):
            raise _error(name, line, f"not a JSON object: {_show(record)}")
        yield line, record


def _csv_records(f: TextIO, name: str, columns: tuple[str, ...]) -> _Records:
    reader = csv.DictReader(f)
    try:
        if reader.fieldnames is None:
            return  # empty file: read_trace reports no requests
        reader.fieldnames = [column.strip() for column in reader.fieldnames]
        missing = [column for column in columns if column not in reader.fieldnames]
        if missing:
            has = ",".join(reader.fieldnames)
            raise _error(name, 1, f"header lacks {', '.join(map(repr, missing))} (has: {has})")
        for record in reader:
            yield reader.line_num, record  # physical line of the row's end; the header is line 1
    except csv.Error as e:
        raise _error(name, reader.line_num, f"bad CSV: {e}") from None


def _show(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _get(record: dict[str, Any], key: str) -> Any:
    value = record.get(key)
    if value is None or (isinstance(value, str) and not value.strip()):
        raise _RowError(f"missing {key!r}")
    return value


def _number(record: dict[str, Any], key: str, kind: str = "a number") -> float:
    """A finite number; from CSV strings, '12' and '12.0' both count."""
    value = _get(record, key)
    number = math.nan
    if isinstance(value, str):
        with contextlib.suppress(ValueError):
            number = float(value)
    elif isinstance(value, int | float) and not isinstance(value, bool):
        number = float(value)
    if not math.isfinite(number) or (kind == "an integer" and not number.is_integer()):
        raise _RowError(f"{key!r} is not {kind}: {_show(value)}")
    return number


def _int(record: dict[str, Any], key: str, minimum: int = 1) -> int:
    number = int(_number(record, key, "an integer"))
    if number < minimum:
        raise _RowError(f"{key!r} must be at least {minimum}: {number}")
    return number


def _datetime_s(record: dict[str, Any], key: str) -> float:
    """Azure's '2023-11-16 18:15:46.6805900' (7 fraction digits; Python >= 3.11 truncates them
    to 6), with or without a '+00:00' suffix; naive times are taken as UTC."""
    value = _get(record, key)
    try:
        moment = datetime.fromisoformat(value.strip())
    except ValueError:
        raise _RowError(f"{key!r} is not a date-time: {_show(value)}") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()


def _hash_ids(record: dict[str, Any]) -> tuple[int, ...]:
    value = _get(record, "hash_ids")
    if not (isinstance(value, list) and all(type(h) is int for h in value)):  # bools are out
        raise _RowError(f"'hash_ids' is not a list of integers: {_show(value)}")
    return tuple(value)


def _mooncake(record: dict[str, Any]) -> _Parsed:
    ts_ms = _number(record, "timestamp")
    input_len = _int(record, "input_length")
    output_len = _int(record, "output_length")
    hash_ids = _hash_ids(record)
    blocks = -(-input_len // MOONCAKE_BLOCK_TOKENS)
    if len(hash_ids) != blocks:
        raise _RowError(
            f"'hash_ids' has {len(hash_ids)} ids, 'input_length' {input_len} needs {blocks}"
        )
    return ts_ms / 1000.0, input_len, output_len, hash_ids, None


def _azure(record: dict[str, Any]) -> _Parsed:
    ts = _datetime_s(record, "TIMESTAMP")
    return ts, _int(record, "ContextTokens"), _int(record, "GeneratedTokens"), (), None


def _burstgpt(record: dict[str, Any]) -> _Parsed:
    ts = _number(record, "Timestamp")
    model = str(_get(record, "Model")).strip()
    input_len = _int(record, "Request tokens")
    output_len = _int(record, "Response tokens", minimum=0)  # 0: a failed request
    return ts, input_len, output_len, (), model


def _jsonl(record: dict[str, Any]) -> _Parsed:
    ts = _number(record, "timestamp")
    input_len, output_len = _int(record, "input_len"), _int(record, "output_len")
    hash_ids = _hash_ids(record) if record.get("hash_ids") is not None else ()
    return ts, input_len, output_len, hash_ids, None


_PARSERS = {"mooncake": _mooncake, "azure": _azure, "burstgpt": _burstgpt, "jsonl": _jsonl}
