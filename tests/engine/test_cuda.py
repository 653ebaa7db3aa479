"""Checks that need a CUDA GPU: skipped here, run by benchmarks/gpu_check.sh where one is lent.
(The kernel tests in test_triton_kernels.py and test_triton_backend.py run on the GPU too
where there is one, compiled instead of interpreted.)"""

from __future__ import annotations

import time

import pytest
import torch

from engine import LLM, SamplingParams

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

PROMPTS = [
    "The capital of France is",
    "def quicksort(xs):",
    "A short story about a robot who learns to paint:",
    " ".join(f"Item {i}: a {'red' if i % 3 else 'blue'} box." for i in range(25)),
]
PARAMS = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)


def tokens(**engine_args) -> list[list[int]]:
    llm = LLM("smollm2-135m", dtype="float32", max_num_batched_tokens=64, **engine_args)
    return [o.outputs[0].token_ids for o in llm.generate(PROMPTS, PARAMS)]


def test_smollm2_greedy_is_the_same_with_the_triton_kernels_on_cuda() -> None:
    # float32 (IEEE products in the kernels: no TF32), chunked prefill beside decodes
    assert tokens(attention_backend="triton") == tokens(attention_backend="torch")


def test_cuda_graphs_replay_what_their_buffers_compute_eagerly() -> None:
    """Graphs against the same static buffers run eagerly (capture=False): the same bucket
    sizes, so the same cuBLAS row counts; requests end at different steps, so batches shrink
    and get padded."""
    from engine.cuda_graphs import DecodeGraphs

    params = [SamplingParams(max_tokens=k, ignore_eos=True) for k in (8, 13, 17, 24)]
    args = {"dtype": "float32", "attention_backend": "triton", "max_num_seqs": 8}
    graphed = LLM("smollm2-135m", cuda_graphs=True, **args)
    assert graphed.llm_engine.runner.graphs is not None
    eager = LLM("smollm2-135m", **args)
    engine = eager.llm_engine
    max_blocks = -(-engine.max_model_len // engine.config.cache.block_size)
    runner = engine.runner
    runner.graphs = DecodeGraphs(runner.model, runner.kv_caches, 8, max_blocks, capture=False)
    got, want = (
        [o.outputs[0].token_ids for o in llm.generate(PROMPTS, params)] for llm in (graphed, eager)
    )
    assert got == want


def test_fp8_kv_cache_with_the_triton_kernels_runs_and_stays_close() -> None:
    want = tokens(attention_backend="torch", kv_cache_dtype="fp8")
    got = tokens(attention_backend="triton", kv_cache_dtype="fp8")
    same = sum(a == b for w, g in zip(want, got, strict=True) for a, b in zip(w, g, strict=True))
    assert same >= 0.9 * sum(len(w) for w in want)  # dequantization order may flip a near-tie


def test_nvml_telemetry_fills_the_gpu_columns() -> None:
    from loadgen.telemetry import Telemetry

    tel = Telemetry(interval_s=0.05)
    tel.start()
    x = torch.randn(4096, 4096, device="cuda")
    for _ in range(50):
        x = x @ x.T / 4096
    torch.cuda.synchronize()
    time.sleep(0.3)
    tel.stop()
    assert tel.rows and any(k.startswith("gpu0_") for k in tel.rows[-1])
    assert max(r.get("gpu0_memory_used_mb", 0) for r in tel.rows) > 0
