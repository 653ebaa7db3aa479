"""Per-step model FLOPs and bytes (engine/model/cost.py) in the engine's step log, the device
peak they are divided by (measured once per machine, cached), and the report that shows both."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from bench_cli import device_peak as dp
from bench_cli.report.steps import steps_figure, utilization_text
from engine import LLM, SamplingParams
from engine.model.cost import kv_bytes_per_token, matmul_params, step_cost
from engine.model.sources import TINY_CONFIGS

CFG = TINY_CONFIGS["tiny-llama"]


def test_step_cost_counts_each_query_against_its_own_prefix() -> None:
    # A 4-token first chunk: queries see 1, 2, 3, 4 keys; a decode at context 10 sees 11.
    cost = step_cost(CFG, [(0, 4), (10, 1)], sampled_rows=2, weight_bytes_per_param=4.0,
                     kv_bytes_per_elem=2.0, head_bytes_per_param=4.0)  # fmt: skip
    per_pair = 4 * CFG.num_layers * CFG.num_heads * CFG.head_dim
    head = CFG.hidden_size * CFG.vocab_size
    assert cost.flops == 2 * matmul_params(CFG) * 5 + 2 * head * 2 + per_pair * (10 + 11)
    assert cost.weight_bytes == matmul_params(CFG) * 4 + head * 4
    kv = kv_bytes_per_token(CFG, 2.0)
    assert (cost.kv_read_bytes, cost.kv_write_bytes) == (kv * (4 + 11), kv * 5)
    assert step_cost(CFG, [(0, 16)], 0, 1.0, 1.0).weight_bytes == matmul_params(CFG)  # no head


def test_step_log_lines_carry_the_exact_cost(tmp_path: Path) -> None:
    llm = LLM("tiny-llama", dtype="float32", enforce_eager=True)
    engine = llm.llm_engine
    engine.log_steps(tmp_path / "steps.jsonl")
    llm.generate([list(range(5, 25))], SamplingParams(max_tokens=3, ignore_eos=True))
    engine.log_steps(None)
    lines = [json.loads(x) for x in (tmp_path / "steps.jsonl").read_text().splitlines()]
    chunks = [[(0, 20)], [(20, 1)], [(21, 1)]]  # the prompt, then two decodes
    assert len(lines) == 3
    for line, chunk in zip(lines, chunks, strict=True):
        want = step_cost(CFG, chunk, 1, 4.0, 4.0, 4.0)
        got = (line["flops"], line["weight_bytes"], line["kv_read_bytes"], line["kv_write_bytes"])
        assert got == (want.flops, want.weight_bytes, want.kv_read_bytes, want.kv_write_bytes)


def test_device_peak_is_measured_once_a_machine(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = []
    fake = {"peak_flops": 1e11, "peak_bytes_per_s": 2e10, "peak_read_bytes_per_s": 2.5e10}
    monkeypatch.setattr(dp, "measure_peak", lambda *a: calls.append(a) or dict(fake))
    monkeypatch.setenv("SERVEBENCH_CACHE_DIR", str(tmp_path))
    first, second = dp.device_peak("cpu"), dp.device_peak("cpu")
    assert len(calls) == 1 and not first["cached"] and second["cached"]
    assert second["peak_flops"] == 1e11 and second["machine"] == first["machine"]
    assert "float32" in first["machine"] and (tmp_path / "device_peak.json").is_file()


def test_report_shows_achieved_rates_against_the_peak() -> None:
    steps = pd.DataFrame({
        "t": [0.0, 1.0, 2.0], "dur_s": [0.5, 0.1, 0.1], "prefill_tokens": [64, 0, 0],
        "decode_tokens": [0, 2, 2], "kv_blocks_used": [4, 4, 4],
        "flops": [5e9, 1e8, 1e8], "weight_bytes": [1e9, 1e9, 1e9],
        "kv_read_bytes": [0.0, 1e8, 1e8], "kv_write_bytes": [1e6, 1e6, 1e6],
    })  # fmt: skip
    peak = {"peak_flops": 1e11, "peak_read_bytes_per_s": 2e10}
    text = utilization_text(steps, peak)
    assert "decode steps: 1.0 GFLOP/s, 11.0 GB/s (1% of matmul peak, 55% of read bandwidth)" in text
    assert "steps with prefill: 10.0 GFLOP/s" in text
    fig = steps_figure(steps, 0.0, peak)
    titles = [a.text for a in fig.layout.annotations]
    assert "achieved GFLOP/s (model FLOPs)" in titles and "matmul peak 100" in titles
    # A step log without the counts (an older run) draws the first three panels only.
    old = steps.drop(columns=["flops", "weight_bytes", "kv_read_bytes", "kv_write_bytes"])
    assert utilization_text(old, peak) == ""
    assert len(steps_figure(old, 0.0).layout.annotations) == 3
