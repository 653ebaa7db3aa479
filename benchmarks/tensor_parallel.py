"""Decode-step time and all-reduce time per step with the weights on 1 and on N ranks,
side by side in one process: the engines take decode steps in turn (A, B, C, A, ...) so a noisy
machine slows them alike, each with its own share of the cores (one rank: all of them; N
ranks: 1/N each, as the engine sets). Prints the median step, the median all-reduce time per
step (rank 0's) and the ratio to one eager rank; greedy tokens of all engines are compared.

    python benchmarks/tensor_parallel.py                     # SmolLM2, B = 1, 8, 32, N = 2
    python benchmarks/tensor_parallel.py --batch 8 --steps 30 --tp 2

On one 2-core CPU, N = 2 cannot be faster: the cores are split, not added, and each of a
step's 61 all-reduces (2 per layer and the embedding) crosses processes. What it shows is the
communication cost a multi-device run pays, and that the split computes the same tokens."""

from __future__ import annotations

import argparse
import statistics
import time

# isort: off
import engine  # noqa: F401 (first: it tunes glibc's allocator before torch allocates)

# isort: on
import torch

from engine.config import EngineConfig
from engine.core.request import SamplingParams
from engine.engine import LLMEngine


def setup(model: str, args: dict, batch: int, context: int, max_tokens: int) -> LLMEngine:
    eng = LLMEngine(
        EngineConfig.from_kwargs(
            model, dtype="float32", max_num_seqs=batch, enable_prefix_caching=False, **args
        )
    )
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    for i in range(batch):
        prompt = [(37 * i + 11 * k) % 5000 + 100 for k in range(context)]
        eng.add_request(f"r{i}", prompt, params)
    while any(r.num_output_tokens == 0 for r in eng.requests.values()):  # prefill
        eng.step()
    return eng


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--context", type=int, default=128)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--tp", type=int, default=2)
    a = parser.parse_args()
    cores = torch.get_num_threads()
    paths = {
        "1 rank, compiled": ({}, cores),
        "1 rank, eager": ({"enforce_eager": True}, cores),
        f"{a.tp} ranks": ({"tensor_parallel_size": a.tp}, max(1, cores // a.tp)),
    }
    print(f"{a.model}, float32, context {a.context}, {cores} threads; steps of decodes only")
    print(
        f"{'path':<18} {'B':>3} {'step ms':>8} {'all-reduce ms':>14} {'share':>6} {'vs eager':>9}"
    )
    for batch in a.batch:
        engines = {}
        for name, (args, _) in paths.items():
            engines[name] = setup(a.model, args, batch, a.context, a.warmup + a.steps + 16)
        times: dict[str, list[float]] = {n: [] for n in paths}
        reduce: dict[str, list[float]] = {n: [] for n in paths}
        for i in range(a.warmup + a.steps):
            for name, eng in engines.items():
                torch.set_num_threads(paths[name][1])
                before = eng.stats()["tp_allreduce_seconds_total"]
                t0 = time.perf_counter()
                eng.step()
                if i >= a.warmup:
                    times[name].append(time.perf_counter() - t0)
                    reduce[name].append(eng.stats()["tp_allreduce_seconds_total"] - before)
        outputs = {
            name: [eng.requests[f"r{i}"].output_token_ids for i in range(batch)]
            for name, eng in engines.items()
        }
        base = statistics.median(times["1 rank, eager"])
        for name in paths:
            step = statistics.median(times[name])
            red = statistics.median(reduce[name])
            same = outputs[name] == outputs["1 rank, eager"]
            print(
                f"{name:<18} {batch:>3} {step * 1e3:>8.1f} {red * 1e3:>14.1f} "
                f"{red / step:>6.0%} {base / step:>8.2f}x" + ("" if same else "  TOKENS DIFFER")
            )
        for eng in engines.values():
            eng.shutdown()
        torch.set_num_threads(cores)


if __name__ == "__main__":
    main()
