"""(A helper) one engine in this process, refilled with `batch` random prompts and stepped
until every sequence decodes, then its decode steps timed on the calling thread: what
run_vs_offline.py and openmp_pools.py compare against."""

from __future__ import annotations

import statistics
import time


class DecodeSteps:
    def __init__(self, model: str, dtype: str, max_num_seqs: int) -> None:
        import torch

        from engine.config import EngineConfig
        from engine.engine import LLMEngine

        self.eng = LLMEngine(EngineConfig.from_kwargs(model, dtype=dtype,
                                                      max_num_seqs=max_num_seqs))  # fmt: skip
        self.gen = torch.Generator().manual_seed(0)
        self.added = 0

    def fill(self, batch: int, prompt_len: int) -> None:
        """Abort what runs; add `batch` random prompts; step until each has its first token."""
        import torch

        from engine.core.request import SamplingParams

        eng = self.eng
        for request_id in list(eng.requests):
            eng.abort_request(request_id)
        vocab = eng.runner.model.config.vocab_size
        params = SamplingParams(max_tokens=10**6, temperature=0.0, ignore_eos=True)
        for _ in range(batch):
            self.added += 1
            prompt = torch.randint(0, vocab, (prompt_len,), generator=self.gen).tolist()
            eng.add(eng.make_request(f"r{self.added}", prompt, params))
        while eng.scheduler.num_waiting or any(
            not r.num_output_tokens for r in eng.scheduler.running
        ):
            eng.step()

    def median_ms(self, steps: int) -> float:
        """One step not timed (on a new thread, it makes that thread's OpenMP pool), then the
        median of `steps` decode steps."""
        self.eng.step()
        times = []
        for _ in range(steps):
            t0 = time.perf_counter()
            self.eng.step()
            times.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(times)
