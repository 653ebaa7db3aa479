"""A run's result in the layout `vllm bench serve --save-result --save-detailed` writes
(vllm/benchmarks/serve.py), so dashboards and scripts built for vLLM's files read ours.

Every value follows vLLM's definition, computed from our records: latency statistics in ms
(mean, median, numpy's population std, and p99 as `--metric-percentiles` defaults to), the
per-request lists in seconds and in request order, failed requests in the lists with zeros as
vLLM leaves them. We keep no generated text: `generated_texts` holds empty strings."""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np

from bench_cli.export import RUN_FILES, write_json
from loadgen.metrics import SLO, Latencies
from loadgen.records import RequestRecord

DEFAULT_PERCENTILES = (99.0,)  # vLLM's --metric-percentiles default
RAMP_KEYS = ("ramp_up_strategy", "ramp_up_start_rps", "ramp_up_end_rps")


def vllm_result(
    summary: dict[str, Any],
    records: Sequence[RequestRecord],
    percentiles: Sequence[float] = DEFAULT_PERCENTILES,
    now: datetime | None = None,
) -> dict[str, Any]:
    """vLLM's result dict for a run: its summary (with `config`, as run_one writes it) and its
    records (warm-up ones are left out, as is any request the run cancelled unfinished)."""
    run = summary["config"]["run"]
    done = sorted(
        (r for r in records if not r.warmup and r.status in ("ok", "error")),
        key=lambda r: r.index,
    )
    ok = [r for r in done if r.ok]
    lat = Latencies.of(ok)  # as the summary computes them
    ttft, e2el, tpot = lat.ttft.tolist(), lat.e2e.tolist(), lat.tpot.tolist()
    itl = [g for r in ok for g in _itl(r)]
    duration = summary["duration_s"]
    rate = _rate(run)
    concurrency = run.get("concurrency")
    t0 = summary.get("clock_t0") or 0.0  # perf_counter at t=0: vLLM's start_times are raw
    result: dict[str, Any] = {
        "date": (now or datetime.now()).strftime("%Y%m%d-%H%M%S"),
        "endpoint_type": _backend(run),
        "backend": _backend(run),
        "label": run.get("name"),
        "model_id": run.get("model"),
        "tokenizer_id": summary["config"].get("tokenizer"),
        "num_prompts": sum(not r.warmup for r in records),
        "request_rate": "inf" if math.isinf(rate) else rate,
        "burstiness": _burstiness(run),
        "max_concurrency": concurrency,
    }
    if run.get("ramp_up_strategy"):  # vLLM writes these before the results, as here
        result |= {k: run.get(k) for k in RAMP_KEYS}
    result |= {
        "duration": duration,
        "completed": len(ok),
        "failed": len(done) - len(ok),
        "total_input_tokens": summary["total_input_tokens"],
        "total_output_tokens": summary["total_output_tokens"],
        "request_throughput": summary["request_throughput"],
        "request_goodput": _goodput(ok, run.get("slo"), duration),
        "output_throughput": summary["output_throughput"],
        "total_token_throughput": summary["total_token_throughput"],
        "input_lens": [
            r.prompt_tokens if r.prompt_tokens is not None else r.input_len for r in done
        ],
        "output_lens": [r.output_tokens if r.ok else 0 for r in done],
        "ttfts": [_ttft(r) for r in done],
        "itls": [_itl(r) for r in done],
        "latencies": [r.end_s - r.send_s if r.ok else 0.0 for r in done],  # type: ignore[operator]
        "start_times": [t0 + r.send_s if r.send_s is not None else 0.0 for r in done],
        "queue_times": [r.queue_s for r in done],
        "generated_texts": [""] * len(done),  # not kept by our records
        "errors": [r.error or "" for r in done],
        "max_output_tokens_per_s": summary["peak_output_throughput"],
        "max_concurrent_requests": summary["peak_concurrent_requests"],
        "rtfx": 0.0,  # audio benchmarks only
    }
    stats = {"ttft": ttft, "tpot": tpot, "itl": itl, "e2el": e2el}
    if concurrency is not None:  # vLLM adds these under --max-concurrency
        queue = [r.queue_s for r in ok]
        stats["client_queue_time"] = queue
        if not math.isinf(rate):
            stats["e2el_including_client_queue"] = [e + q for e, q in zip(e2el, queue, strict=True)]
    for name, values in stats.items():
        result |= _stats(name, values, percentiles)
    return result


def check_vllm_json_path(path: str, out: str | None, overwrite: bool) -> None:
    """Before the run: never over one of the run's own files, nor (unless asked) over any
    existing file (vLLM's bench overwrites silently; an hour's result is not replaced so)."""
    target = Path(path).resolve()
    if out and target.parent == Path(out).resolve() and target.name in RUN_FILES:
        raise ValueError(f"--save-vllm-json {path}: that is this run's own {target.name}")
    if target.is_dir():
        raise ValueError(f"--save-vllm-json {path}: a folder; name a file")
    if target.exists() and not overwrite:
        raise ValueError(
            f"--save-vllm-json {path}: the file exists; pass --overwrite-vllm-json to replace it"
        )


def write_vllm_json(
    path: str | Path, summary: dict[str, Any], records: Sequence[RequestRecord]
) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json(path, vllm_result(summary, records))


def _ttft(r: RequestRecord) -> float:
    """A failed request keeps a first-chunk time it got, as vLLM's does; else 0.0."""
    if r.first_chunk_s is None or r.send_s is None:
        return 0.0
    return r.first_chunk_s - r.send_s


def _itl(r: RequestRecord) -> list[float]:
    return [gap for gap, _ in r.gaps()]  # within each choice's chunks when n > 1


def _stats(name: str, values: list[float], percentiles: Sequence[float]) -> dict[str, float]:
    """vLLM's mean/median/std/pN in ms; an empty list gives zeros, as its `values or 0` does."""
    a = np.asarray(values or [0.0], dtype=np.float64) * 1000
    out = {
        f"mean_{name}_ms": float(a.mean()),
        f"median_{name}_ms": float(np.median(a)),
        f"std_{name}_ms": float(a.std()),
    }
    for p in percentiles:
        word = str(int(p)) if int(p) == p else str(p)
        out[f"p{word}_{name}_ms"] = float(np.percentile(a, p))
    return out


def _goodput(ok: Sequence[RequestRecord], slo_text: str | None, duration: float) -> float | None:
    """vLLM's goodput: requests within every SLO, the queue wait not counted (ours counts it)
    and a one-token request's TPOT taken as 0; None without SLOs."""
    slo = SLO.parse(slo_text)
    if not slo.as_dict():
        return None
    good = 0
    for r in ok:
        ttft, e2e = _ttft(r), r.end_s - r.send_s  # type: ignore[operator]
        per_seq = r.tokens_per_sequence
        tpot = (e2e - ttft) / (per_seq - 1) if per_seq > 1 else 0.0
        good += slo.met(ttft, tpot, e2e)
    return good / max(duration, 1e-9)


def _backend(run: dict[str, Any]) -> str:
    return "openai-chat" if run.get("endpoint") == "chat" else "openai"


def _rate(run: dict[str, Any]) -> float:
    """vLLM's request_rate: inf for a closed loop and for a trace (it sends at the trace's
    times, its rate left at the default)."""
    rate = run.get("rate")
    if run.get("arrival") == "trace" or rate is None:
        return math.inf
    return float(rate)


def _burstiness(run: dict[str, Any]) -> float:
    """Gamma's shape; 1 for Poisson (and vLLM's default elsewhere); inf for constant gaps,
    which is what vLLM's inf burstiness sends."""
    if run.get("arrival") == "constant":
        return math.inf
    if run.get("arrival") == "gamma" and run.get("burstiness") is not None:
        return float(run["burstiness"])
    return 1.0
