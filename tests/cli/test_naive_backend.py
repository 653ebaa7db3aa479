"""The naive serving baseline (transformers `generate`, one request at a time or in static
batches): the engine's model and outputs, static batching's timing, `bench run --naive-batch`
end to end, and the combinations it refuses.

Found: in float32 on the tiny random model, left-padded batches give the engine's greedy text
exactly (no flipped token), so batches are compared as strictly as one request at a time."""

from __future__ import annotations

import asyncio
import io
import itertools
import json
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from bench_cli.run.execute import execute
from loadgen.records import RequestRecord
from loadgen.workload import RequestSpec

pytest.importorskip("transformers")

MODEL = "tiny-smollm2"
PROMPTS = [  # all of different token lengths: a batch of them is left-padded
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a land far away, there lived a",
    "1, 2, 3, 4,",
    "Hello",
    "Question: What is the boiling point of water at sea level in Celsius?\nAnswer:",
]
MAX_TOKENS = 10


def naive(batch: int, **kw: Any) -> Any:
    from loadgen.naive_backend import NaiveBackend

    return NaiveBackend(MODEL, batch, dtype="float32", **kw)


def serve(batch: int, prompts: list[str], output_lens: list[int], **kw: Any) -> list[Any]:
    """Send every prompt at once to a fresh naive backend; the records, with reply text."""
    backend = kw.pop("backend", None) or naive(batch, **kw)

    async def main() -> list[RequestRecord]:
        await backend.start()
        t0 = time.perf_counter()
        # session=0 keeps the reply text (kept only for conversations otherwise)
        recs = [
            RequestRecord(i, f"r{i}", 0, n, session=0, turn=0) for i, n in enumerate(output_lens)
        ]
        specs = [RequestSpec(p, 0, n) for p, n in zip(prompts, output_lens, strict=True)]
        await asyncio.gather(*(backend.send(s, r, t0) for s, r in zip(specs, recs, strict=True)))
        await backend.close()
        return recs

    return asyncio.run(main())


@pytest.fixture(scope="module")
def engine_outputs() -> list[Any]:
    """The bundled engine's greedy completions of PROMPTS (one batch, float32)."""
    from engine import LLM, SamplingParams

    llm = LLM(MODEL, dtype="float32")
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True)
    outs = [o.outputs[0] for o in llm.generate(PROMPTS, params)]
    assert all(len(o.token_ids) == MAX_TOKENS for o in outs)
    return outs


@pytest.fixture(scope="module")
def engine_texts(engine_outputs: list[Any]) -> list[str]:
    return [o.text for o in engine_outputs]


@pytest.mark.parametrize("batch", [1, 4])
def test_greedy_text_equals_the_engine(engine_texts: list[str], batch: int) -> None:
    recs = serve(batch, PROMPTS, [MAX_TOKENS] * len(PROMPTS))
    assert all(r.status == "ok" for r in recs), [r.error for r in recs]
    assert [r.reply for r in recs] == engine_texts
    assert all(r.output_tokens == MAX_TOKENS == len(r.chunk_s) for r in recs)
    assert all(r.finish_reason == "length" and r.output_tokens_source == "engine" for r in recs)


def test_prompt_tokens_are_the_engines() -> None:
    from engine.model.sources import load_tokenizer

    tok = load_tokenizer(MODEL)
    assert tok is not None
    recs = serve(1, PROMPTS[:2], [2, 2])
    assert [r.prompt_tokens for r in recs] == [len(tok.encode(p)) for p in PROMPTS[:2]]


def test_a_static_batch_starts_together_and_frees_its_slots_only_when_it_ends() -> None:
    output_lens = [2, 8, 4, 8, 3, 3]  # the first batch's short requests finish early
    recs = serve(4, PROMPTS, output_lens)
    assert [r.output_tokens for r in recs] == output_lens
    starts = sorted({r.chunk_s[0] for r in recs})
    batches = [[r for r in recs if r.chunk_s[0] == s] for s in starts]
    assert [len(b) for b in batches] == [4, 2]
    first, second = batches
    # each request completes at its own length ...
    assert min(r.end_s for r in first) < max(r.end_s for r in first)
    # ... but the next batch starts only after the longest of the previous one
    assert min(r.chunk_s[0] for r in second) > max(r.end_s for r in first)
    # one step, one stamp: the batch's rows share every step's time
    assert first[0].chunk_s[:2] == first[1].chunk_s[:2]


def test_one_at_a_time_serves_requests_in_turn() -> None:
    recs = serve(1, PROMPTS[:3], [3, 3, 3])
    for before, after in itertools.pairwise(recs):
        assert after.chunk_s[0] > before.end_s


def test_sampling_settings_reach_generate(engine_texts: list[str]) -> None:
    """A hot temperature over the whole vocabulary cannot give the greedy text; top_k 1
    (top_p near 0 as well) brings it back, so both reach `generate`."""
    prompts, lens = PROMPTS[:3], [MAX_TOKENS] * 3
    hot = serve(2, prompts, lens, sampling={"temperature": 50.0})
    assert all(r.status == "ok" and r.output_tokens == MAX_TOKENS for r in hot)
    assert all(r.reply != text for r, text in zip(hot, engine_texts, strict=False))
    for narrow in ({"top_k": 1}, {"top_p": 1e-6}):
        recs = serve(2, prompts, lens, sampling={"temperature": 50.0} | narrow)
        assert [r.reply for r in recs] == engine_texts[:3], narrow


def test_without_ignore_eos_a_request_stops_at_its_eos_token(engine_outputs: list[Any]) -> None:
    third = engine_outputs[0].token_ids[2]
    assert third not in engine_outputs[1].token_ids
    backend = naive(2, ignore_eos=False)
    backend.eos = (third,)  # the first prompt's greedy third token stands for eos
    stopped, other = serve(2, PROMPTS[:2], [MAX_TOKENS] * 2, backend=backend)
    assert stopped.status == "ok" and stopped.finish_reason == "stop"
    assert stopped.output_tokens == 3
    assert other.output_tokens == MAX_TOKENS and other.finish_reason == "length"


def test_without_transformers_the_error_says_how_to_install_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from loadgen.naive_backend import NaiveBackend

    monkeypatch.setitem(sys.modules, "transformers", None)  # import transformers fails
    with pytest.raises(ValueError, match="pip install transformers"):
        NaiveBackend(MODEL, 1)


def bench_run(tmp_path: Path, **flags: Any) -> tuple[int, str, Path]:
    out = tmp_path / "run"
    buf = io.StringIO()
    small = {
        "model": MODEL,
        "rate": 20.0,
        "num_requests": 6,
        "warmup": 1,
        "input_len": "uniform:8:48",
        "output_len": "6",
        "out": str(out),
    }
    rc = execute("default", small | flags, dashboard=False, console=Console(file=buf, width=120))
    return rc, buf.getvalue(), out


def test_bench_run_naive_batch_end_to_end(tmp_path: Path) -> None:
    rc, printed, out = bench_run(tmp_path, naive_batch=2, max_num_seqs=8)
    assert rc == 0, printed
    assert "static batches of 2" in " ".join(printed.split())
    summary = json.loads((out / "summary.json").read_text())
    assert summary["completed"] == 6 and summary["failed"] == 0
    assert summary["total_output_tokens"] == 36
    for key in ("ttft_s", "itl_s", "tpot_s"):
        assert summary[key]["mean"] is not None and summary[key]["mean"] > 0
    config = json.loads((out / "config.json").read_text())
    assert config["target"] == {
        "kind": "naive-in-process",
        "server": "transformers generate, static batches of 2 (in process)",
    }
    assert config["naive"]["ignored_engine_settings"] == ["max_num_seqs"]
    assert "--max-num-seqs ignored" in " ".join(printed.split())  # said, not silent
    assert "engine" not in config
    assert not (out / "steps.jsonl").exists() and not (out / "server.log").exists()
    assert (out / "timeline.csv").is_file()


@pytest.mark.parametrize(
    ("flags", "error"),
    [
        ({"naive_batch": 0}, "naive batch must be >= 1"),
        ({"naive_batch": 2, "base_url": "http://127.0.0.1:9/v1"}, "cannot go with --base-url"),
        ({"naive_batch": 2, "in_process": True}, "cannot go with --in-process"),
        ({"naive_batch": 2, "n": 2}, "one completion a prompt"),
        ({"naive_batch": 2, "quantization": "fp8"}, "--quantization"),
        ({"naive_batch": 2, "kv_cache_dtype": "fp8"}, "--kv-cache-dtype"),
        ({"naive_batch": 2, "extra_body": '{"min_p": 0.1}'}, "go over HTTP"),
    ],
)
def test_refused_combinations_are_clear_errors(tmp_path: Path, flags: dict, error: str) -> None:
    rc, printed, _ = bench_run(tmp_path, **flags)
    assert rc == 2 and error in " ".join(printed.split()), printed


def test_a_sweep_bundle_can_name_the_naive_baseline(tmp_path: Path) -> None:
    from bench_cli.run.execute import resolve_config
    from bench_cli.sweep.grid import grid, load_sweep
    from bench_cli.sweep.point import point_flags

    profile = {
        "name": "claims",
        "model": MODEL,
        "rate": 2.0,
        "num_requests": 4,
        "max_num_seqs": 8,
        "sweep": {"server": [{"label": "engine"}, {"label": "hf static 8", "naive_batch": 8}]},
    }
    base, axes = load_sweep(profile)
    engine, naive = (resolve_config(base, point_flags({}, p, tmp_path)) for p in grid(axes))
    assert engine.naive_batch is None and naive.naive_batch == 8
