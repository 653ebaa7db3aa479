"""`bench run --save-vllm-json`: the result in `vllm bench serve --save-result`'s layout, with
vLLM's key names and definitions, agreeing with our own summary."""

from __future__ import annotations

import io
import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from rich.console import Console

from bench_cli.run.execute import execute
from bench_cli.run.vllm_json import vllm_result
from loadgen.metrics import summarize
from loadgen.records import RequestRecord

# The keys vllm/benchmarks/serve.py writes (main_async's result_json merged with benchmark()'s
# result, --save-detailed), with the default --percentile-metrics ttft,tpot,itl plus e2el.
VLLM_KEYS = {
    "date", "endpoint_type", "backend", "label", "model_id", "tokenizer_id", "num_prompts",
    "request_rate", "burstiness", "max_concurrency", "duration", "completed", "failed",
    "total_input_tokens", "total_output_tokens", "request_throughput", "request_goodput",
    "output_throughput", "total_token_throughput", "input_lens", "output_lens", "ttfts",
    "itls", "latencies", "start_times", "queue_times", "generated_texts", "errors",
    "max_output_tokens_per_s", "max_concurrent_requests", "rtfx",
    *(f"{s}_{m}_ms" for s in ("mean", "median", "std", "p99")
      for m in ("ttft", "tpot", "itl", "e2el")),
}  # fmt: skip


def test_a_run_writes_vllm_json_that_agrees_with_its_summary(
    tmp_path: Path, mock_server: Callable[..., str]
) -> None:
    url = mock_server("--ttft", "0.02", "--itl", "0.005")
    path = tmp_path / "vllm" / "result.json"  # its folder is made
    flags: dict[str, Any] = {
        "base_url": url,
        "model": "mock",
        "rate": 40.0,
        "max_p99_lag_ms": 1000.0,  # a busy machine's lag is not checked here
        "concurrency": 3,
        "num_requests": 12,
        "warmup": 2,
        "input_len": "16",
        "output_len": "6",
        "slo": "ttft=5",
        "out": str(tmp_path / "run"),
        "save_vllm_json": str(path),
    }
    buf = io.StringIO()
    rc = execute("default", flags, dashboard=False, console=Console(file=buf, width=120))
    assert rc == 0, buf.getvalue()
    assert "Peak concurrent requests" in buf.getvalue()
    v = json.loads(path.read_text(), parse_constant=lambda c: pytest.fail(f"not JSON: {c}"))
    s = json.loads((tmp_path / "run" / "summary.json").read_text())

    assert set(v) >= VLLM_KEYS
    assert {"mean_client_queue_time_ms", "p99_e2el_including_client_queue_ms"} <= set(v)
    assert v["backend"] == "openai" and v["model_id"] == "mock"
    assert v["request_rate"] == 40.0 and v["max_concurrency"] == 3 and v["burstiness"] == 1.0
    assert v["num_prompts"] == 12 and v["completed"] == s["completed"] == 12 and v["failed"] == 0
    assert v["duration"] == s["duration_s"]
    for key in ("total_input_tokens", "total_output_tokens", "request_throughput"):
        assert v[key] == s[key]
    assert v["request_goodput"] == pytest.approx(s["goodput"])  # no queue wait near 5 s
    assert len(v["ttfts"]) == len(v["itls"]) == len(v["generated_texts"]) == 12
    assert v["output_lens"] == [6] * 12 and set(v["generated_texts"]) == {""}
    assert all(isinstance(i, list) and len(i) == 5 for i in v["itls"])  # one per later chunk
    assert v["errors"] == [""] * 12
    for vllm_name, ours in (("ttft", "ttft_s"), ("tpot", "tpot_s"), ("itl", "itl_s")):
        assert v[f"mean_{vllm_name}_ms"] == pytest.approx(s[ours]["mean"] * 1000)
        assert v[f"median_{vllm_name}_ms"] == pytest.approx(s[ours]["p50"] * 1000)
        assert v[f"p99_{vllm_name}_ms"] == pytest.approx(s[ours]["p99"] * 1000)
    assert v["mean_e2el_ms"] == pytest.approx(s["e2e_s"]["mean"] * 1000)
    assert v["std_ttft_ms"] == pytest.approx(np.std(v["ttfts"]) * 1000)  # lists in seconds
    assert v["mean_itl_ms"] == pytest.approx(np.mean(np.concatenate(v["itls"])) * 1000)
    assert v["mean_ttft_ms"] > 15  # ms, not s: the mock's TTFT is 20 ms
    assert v["max_output_tokens_per_s"] == s["peak_output_throughput"] > 0
    assert v["max_concurrent_requests"] == s["peak_concurrent_requests"]
    assert 1 <= v["max_concurrent_requests"] <= 3  # the cap
    assert v["mean_client_queue_time_ms"] == pytest.approx(s["queue_s"]["mean"] * 1000)


def _rec(i: int, send: float, chunks: list[float], **kw: Any) -> RequestRecord:
    r = RequestRecord(i, f"r{i}", 10, len(chunks), scheduled_s=send, send_s=send, **kw)
    r.chunk_s, r.chunk_tokens = chunks, [1] * len(chunks)
    r.first_chunk_s, r.end_s = chunks[0], chunks[-1]
    r.prompt_tokens, r.output_tokens, r.status = 12, len(chunks), "ok"
    return r


def _result(records: list[RequestRecord], slo: str | None = None, **run: Any) -> dict:
    summary = summarize(records, 2.0)
    summary["config"] = {"run": {"name": "x", "model": "m", **run, "slo": slo}, "tokenizer": "t"}
    return vllm_result(summary, records, percentiles=(50, 99.9))


def test_vllm_definitions_on_known_records() -> None:
    a = _rec(1, 0.0, [0.5, 0.6, 0.7, 0.8])  # TTFT .5, TPOT .1 (first token excluded)
    b = _rec(0, 1.0, [1.2, 1.6], queue_s=0.5)  # TTFT .2, TPOT .4, queued .5
    failed = RequestRecord(2, "r2", 10, 4, scheduled_s=1.5, send_s=1.5, status="error")
    failed.error = "HTTP 500"
    warm = _rec(3, -5.0, [-4.0, -3.0], warmup=True)
    v = _result([a, b, failed, warm], slo="ttft=0.3", arrival="poisson", rate=None)
    assert v["num_prompts"] == 3 and v["completed"] == 2 and v["failed"] == 1
    assert v["request_rate"] == "inf" and v["max_concurrency"] is None  # a closed loop
    assert v["ttfts"] == pytest.approx([0.2, 0.5, 0.0])  # request order; failed: 0
    assert v["itls"][0] == pytest.approx([0.4]) and v["itls"][2] == []
    assert v["output_lens"] == [2, 4, 0] and v["input_lens"] == [12, 12, 10]  # failed: asked
    assert v["latencies"] == pytest.approx([0.6, 0.8, 0.0])
    assert v["errors"] == ["", "", "HTTP 500"]
    assert v["mean_tpot_ms"] == pytest.approx(250.0)
    assert v["std_tpot_ms"] == pytest.approx(150.0)  # numpy's (population) std
    assert v["median_ttft_ms"] == pytest.approx(350.0)
    assert v["p50_itl_ms"] == pytest.approx(100.0) and "p99.9_itl_ms" in v
    assert "p99_ttft_ms" not in v  # the percentiles asked for, named as vLLM names them
    assert v["request_goodput"] == pytest.approx(0.5)  # b meets TTFT <= .3: no queue counted


def test_no_success_gives_vllm_zeros_and_arrivals_map_to_vllm_settings() -> None:
    failed = RequestRecord(0, "r0", 10, 4, scheduled_s=0.0, send_s=0.0, status="error")
    v = _result([failed], arrival="constant", rate=5.0, concurrency=2, endpoint="chat")
    assert v["mean_ttft_ms"] == v["p99.9_e2el_ms"] == v["max_output_tokens_per_s"] == 0.0
    assert v["backend"] == "openai-chat" and v["request_goodput"] is None
    assert math.isinf(v["burstiness"]) and v["mean_client_queue_time_ms"] == 0.0
    gamma = _result([_rec(0, 0.0, [0.1])], arrival="gamma", rate=5.0, burstiness=0.5)
    assert gamma["burstiness"] == 0.5 and gamma["request_rate"] == 5.0
    assert "ramp_up_strategy" not in gamma
    ramp = {"ramp_up_strategy": "linear", "ramp_up_start_rps": 1.0, "ramp_up_end_rps": 9.0}
    v = _result([_rec(0, 0.0, [0.1])], arrival="poisson", rate=None, **ramp)
    assert v["request_rate"] == "inf" and {k: v[k] for k in ramp} == ramp  # as vLLM's ramp
    assert list(v).index("ramp_up_end_rps") < list(v).index("duration")
