"""Memory stays bounded under a long varied load: the engine keeps no state per request and
no unbounded state per batch shape."""

import random

import psutil
import pytest
import torch

from engine import LLMEngine, SamplingParams
from engine.config import EngineConfig
from engine.model_store import load_shared
from engine.ops import cpu_kernels, cpu_linear


def varied_load(engine: LLMEngine, rng: random.Random, n: int, start: int = 0) -> None:
    """`n` requests of 1-900 prompt tokens and 1-8 output tokens, run to completion: steps
    of every token count from 1 to the budget."""
    for i in range(start, start + n):
        prompt = [rng.randrange(3, 500) for _ in range(rng.randint(1, 900))]
        params = SamplingParams(max_tokens=rng.randint(1, 8), ignore_eos=True)
        engine.add_request(f"r{i}", prompt, params)
    while engine.has_unfinished_requests():
        engine.step()


def test_packed_linears_run_at_a_bounded_set_of_row_counts(monkeypatch: pytest.MonkeyPatch) -> None:
    """oneDNN keeps state per row count (where the engine's own kernel is not built)."""
    seen: set[int] = set()
    real = cpu_linear.packed_product

    def recording(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        seen.add(x.shape[0])
        return real(x, w)

    monkeypatch.setattr(cpu_linear, "packed_product", recording)
    monkeypatch.setattr(cpu_kernels, "available", lambda: False)
    load_shared.cache_clear()  # models packed for the kernel by earlier tests
    try:
        engine = LLMEngine(EngineConfig.from_kwargs("tiny-llama", max_num_seqs=8))
        assert not engine.runner.model.layers[0].mlp.down_proj.native
        varied_load(engine, random.Random(0), 120)
    finally:
        load_shared.cache_clear()
    allowed = {cpu_linear.padded_rows(m) for m in range(1, cpu_linear.MKL_MIN_ROWS)}
    assert len(allowed) <= 100
    assert seen <= allowed and len(seen) > 15


def test_rss_stops_growing_under_a_long_varied_load() -> None:
    engine = LLMEngine(EngineConfig.from_kwargs("tiny-llama", max_num_seqs=8))
    rng, proc = random.Random(0), psutil.Process()
    rss_mb = []
    for r in range(12):
        varied_load(engine, rng, 40, start=40 * r)
        rss_mb.append(proc.memory_info().rss / 2**20)
    assert engine.kv.num_used_blocks == 0 and not engine.requests
    # Before row counts were bucketed this grew ~35 MB a round, every round.
    assert rss_mb[-1] - rss_mb[5] < 32, [round(x) for x in rss_mb]


def test_serving_keeps_no_python_objects_per_request() -> None:
    import asyncio
    import gc

    import aiohttp
    from aiohttp.test_utils import TestServer

    from engine.serving.async_engine import AsyncLLMEngine
    from engine.serving.server import build_app

    config = EngineConfig.from_kwargs("tiny-smollm2", num_kv_blocks=64, max_num_seqs=4)
    async_engine = AsyncLLMEngine(LLMEngine(config))
    rng = random.Random(1)

    async def batch(session: aiohttp.ClientSession, url: str, n: int) -> None:
        async def one() -> None:
            body = {
                "prompt": "word " * rng.randint(1, 60),
                "max_tokens": rng.randint(1, 6),
                "stream": rng.random() < 0.5,
                "stop": ["zz"] if rng.random() < 0.3 else None,
            }
            async with session.post(url, json=body) as r:
                assert r.status == 200
                await r.read()

        await asyncio.gather(*(one() for _ in range(n)))

    async def main() -> list[int]:
        server = TestServer(build_app(async_engine, "tiny-smollm2"))
        await server.start_server()
        url = str(server.make_url("/v1/completions"))
        counts = []
        try:
            async with aiohttp.ClientSession() as session:
                for _ in range(5):
                    await batch(session, url, 60)
                    await asyncio.sleep(0.1)  # let connections and callbacks settle
                    gc.collect()
                    counts.append(len(gc.get_objects()))
        finally:
            await server.close()
        return counts

    counts = asyncio.run(main())
    assert async_engine.num_in_flight == 0 and not async_engine.engine.requests
    # 180 requests after the second batch: not even one object kept per request.
    assert counts[-1] - counts[1] < 120, counts
