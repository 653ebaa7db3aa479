"""A run's folder on disk: summary.json, summary.csv (one row, via pandas) and config.json
(the resolved config, package versions, git commit and hardware)."""

from __future__ import annotations

import csv
import json
import math
import os
import platform
import subprocess
import sys
import time
from datetime import datetime
from importlib import metadata
from pathlib import Path
from typing import Any

from loadgen import metric_registry

PACKAGES = ("servebench", "torch", "aiohttp", "numpy", "pandas", "tokenizers", "rich", "typer")


# What a run writes in its folder (a sweep's point too): nothing else may write over them.
RUN_FILES = (
    "config.json",
    "requests.jsonl",
    "timeline.csv",
    "summary.json",
    "summary.csv",
    "report.html",
    "steps.jsonl",
    "server.log",
)


def check_name(name: str) -> None:
    """A run's or sweep's name becomes part of one folder name under results/: a path
    (`x/../../elsewhere`), a dot name or a control character would put it elsewhere."""
    bad = (
        not name
        or name in (".", "..")
        or any(sep in name for sep in ("/", "\\", "\0"))
        or not name.isprintable()
        or len(name.encode()) > 200
    )
    if bad:
        raise ValueError(
            f"name {name!r}: give one folder name (no '/', '\\', '..' or control characters, "
            "at most 200 bytes); use --out to write elsewhere"
        )


def run_dir(out: str | None, name: str) -> Path:
    """A new, empty folder: a run never mixes its records with an earlier run's."""
    if not out:
        check_name(name)
        results = Path("results").resolve()
        path = Path("results") / f"{datetime.now():%Y%m%d-%H%M%S}-{name}"
        if path.resolve().parent != results:  # a symlinked results/ resolves with it
            raise ValueError(f"name {name!r} resolves outside {results}")
    else:
        path = Path(out)
    if path.exists() and (not path.is_dir() or any(path.iterdir())):
        raise ValueError(f"results folder {path} already holds files; choose another --out")
    path.mkdir(parents=True, exist_ok=True)
    return path


def write_json(path: Path, data: Any) -> None:
    """Strict JSON: an infinite float (`--rate inf`) is written "inf", NaN null (json.dumps
    would write the bare tokens Infinity and NaN, which JSON parsers other than Python's refuse)."""
    text = json.dumps(_finite(data), indent=2, default=str, allow_nan=False)
    path.write_text(text + "\n")


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def write_summary(out_dir: Path, summary: dict[str, Any]) -> None:
    write_json(out_dir / "summary.json", summary)
    row = summary_row(summary)
    with open(out_dir / "summary.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(row)
        writer.writerow(row.values())


COUNT_UNITS = ("requests", "tokens", "blocks")


def summary_row(summary: dict[str, Any]) -> dict[str, Any]:
    """summary.json as summary.csv's one row: nested objects flattened to dotted columns, a
    rate's unit in its column's name (`output_throughput_tok_per_s`), counts as integers,
    booleans as True/False, lists as JSON, None and NaN as an empty cell."""
    row: dict[str, Any] = {}
    for key, value in _flatten(summary, ("definitions", "warnings")):
        *path, last = key.split(".")
        m = metric_registry.metric(key) or metric_registry.metric(last)
        if m is not None:
            key = ".".join([*path, m.column.rsplit(".", 1)[-1]])
            if m.unit in COUNT_UNITS and isinstance(value, float) and value.is_integer():
                value = int(value)
        row[key] = _cell(value)
    return row


def _flatten(d: dict[str, Any], skip: tuple[str, ...] = (), prefix: str = "") -> list:
    out: list[tuple[str, Any]] = []
    for k, v in d.items():
        if k in skip:
            continue
        if isinstance(v, dict):
            out += _flatten(v, (), f"{prefix}{k}.")
        else:
            out.append((f"{prefix}{k}", v))
    return out


def _cell(value: Any) -> Any:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    if isinstance(value, list | tuple):
        return json.dumps(_finite(value), default=str)
    return value


def environment() -> dict[str, Any]:
    versions = {}
    for pkg in PACKAGES:
        try:
            versions[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            versions[pkg] = None
    return {
        "created_at": time.time(),
        "python": sys.version.split()[0],
        "versions": versions,
        "git_commit": _git_commit(),
        "hardware": hardware(),
    }


def _git_commit() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
            cwd=Path(__file__).resolve().parent,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None


def hardware() -> dict[str, Any]:
    import psutil

    info: dict[str, Any] = {
        "platform": platform.platform(),
        "cpu": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "memory_gb": round(psutil.virtual_memory().total / 2**30, 1),
        "gpus": [],
    }
    try:
        import pynvml

        pynvml.nvmlInit()
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            mem = pynvml.nvmlDeviceGetMemoryInfo(h).total / 2**30
            info["gpus"].append({"name": pynvml.nvmlDeviceGetName(h), "memory_gb": round(mem, 1)})
        pynvml.nvmlShutdown()
    except Exception:  # no driver, no GPU: NVMLError and friends
        pass
    return info


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()
