"""attention_backend="triton" end to end: the engine with engine/ops/triton's kernels (in
Triton's interpreter here, compiled on CUDA) gives the torch backend's greedy tokens in every
batching mode, is resolved and recorded like the other paths, and reaches `bench run` and
`bench serve` as a flag."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
import torch
from rich.console import Console

from engine import LLM, SamplingParams
from engine.resolve import resolve_attention_backend

pytest.importorskip("triton")

# Five prompts, three of which cross a block boundary while decoding; the last shares the
# third's first block (a prefix-cache hit: its first chunk starts at token 16).
PROMPTS = [[5 + i for i in range(n)] for n in (3, 14, 29, 46)]
PROMPTS.append([*PROMPTS[2][:17], 9, 9])
PARAMS = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)

MODES: dict[str, dict[str, Any]] = {
    # chunks of 16 tokens beside decodes: chunks continue mid-block and after cached blocks
    "continuous, chunked-16": dict(max_num_batched_tokens=16),
    "no chunked prefill": dict(enable_chunked_prefill=False, max_num_batched_tokens=256),
    "static": dict(batching="static", max_num_seqs=2),
    "preemption": dict(num_kv_blocks=5, max_num_seqs=5),
    "fp8 KV cache": dict(kv_cache_dtype="fp8", max_num_batched_tokens=32),
}


def generate(backend: str, **engine_args: Any) -> tuple[list[list[int]], LLM]:
    # The torch side stays eager: the oracle is the reference ops themselves.
    llm = LLM("tiny-llama", dtype="float32", attention_backend=backend,
              enforce_eager=backend == "torch", **engine_args)  # fmt: skip
    outs = llm.generate(PROMPTS, PARAMS)
    return [o.outputs[0].token_ids for o in outs], llm


@pytest.mark.parametrize("mode", MODES)
def test_greedy_tokens_match_the_torch_backend(mode: str) -> None:
    want, _ = generate("torch", **MODES[mode])
    got, llm = generate("triton", **MODES[mode])
    assert got == want
    engine = llm.llm_engine
    assert engine.config.attention_backend == "triton"
    assert (engine.decode_attention, engine.model_forward) == ("triton", "triton")
    stats = engine.stats()
    assert stats["kv_blocks_used"] == 0
    if mode == "preemption":
        assert stats["num_preemptions"] > 0
    if mode.startswith("continuous"):
        assert stats["prefix_cache_hits"] > 0


def test_auto_resolves_by_device_and_a_bad_name_is_refused() -> None:
    assert resolve_attention_backend("auto", torch.device("cpu")) == "torch"
    assert resolve_attention_backend("auto", torch.device("cuda")) == "triton"
    assert resolve_attention_backend("torch", torch.device("cuda")) == "torch"
    assert LLM("tiny-llama", enforce_eager=True).llm_engine.config.attention_backend == "torch"
    with pytest.raises(ValueError, match="attention_backend must be"):
        LLM("tiny-llama", attention_backend="flash")


def test_bench_run_through_bench_serve_with_the_triton_backend(tmp_path: Path) -> None:
    from bench_cli.run.execute import execute

    out = tmp_path / "run"
    buf = io.StringIO()
    flags = {"model": "tiny-smollm2", "rate": 20.0, "num_requests": 3, "warmup": 0,
             "input_len": "20", "output_len": "4", "out": str(out),
             "attention_backend": "triton"}  # fmt: skip
    rc = execute("default", flags, dashboard=False, console=Console(file=buf, width=120))
    assert rc == 0, buf.getvalue()
    summary = json.loads((out / "summary.json").read_text())
    assert summary["completed"] == 3 and summary["failed"] == 0
    engine = summary["config"]["engine"]
    assert engine["attention_backend"] == "triton" and engine["model_forward"] == "triton"


def test_decode_graph_buffers_and_padding_give_the_same_tokens() -> None:
    """The static buffers of engine/cuda_graphs.py, run eagerly (capture=False: no GPU here):
    batches of 3 padded to the bucket of 4 (padding rows write no slot and are dropped)."""
    from engine.cuda_graphs import DecodeGraphs, buckets

    assert buckets(5) == [1, 2, 4, 5] and buckets(64)[:5] == [1, 2, 4, 8, 16]
    # Requests end after 2 to 6 tokens, so decode batches shrink from 5 to 1.
    params = [SamplingParams(max_tokens=k, ignore_eos=True) for k in (2, 3, 6, 5, 4)]
    llm = LLM("tiny-llama", dtype="float32", enforce_eager=True, max_num_seqs=5)
    want = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, params)]
    llm = LLM("tiny-llama", dtype="float32", attention_backend="triton", max_num_seqs=5)
    runner = llm.llm_engine.runner
    graphs = DecodeGraphs(runner.model, runner.kv_caches, 5, 4, capture=False)
    runs = []
    original = graphs.run
    graphs.run = lambda ids, *a: runs.append(len(ids)) or original(ids, *a)  # type: ignore[method-assign]
    runner.graphs = graphs
    got = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, params)]
    assert got == want
    assert runs == [5, 4, 3, 2, 1]  # 3 ran padded to 4
    with pytest.raises(ValueError, match="cuda_graphs needs CUDA"):
        LLM("tiny-llama", attention_backend="triton", cuda_graphs=True)
