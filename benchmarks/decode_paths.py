"""Decode-step time of the engine's paths, side by side in one process: engines that differ
only in one setting share the loaded model and take steps in turn (A, B, A, B, ...), so a
noisy machine slows both alike; prints each path's median step and the ratio to the first.

    python benchmarks/decode_paths.py                          # eager vs compiled, B=1,8,32,64
    python benchmarks/decode_paths.py --batch 8 --context 512 --steps 40

Paths: "eager" (enforce_eager=True: eager PyTorch), "attention" (the
eager model with the compiled decode attention of ops/cpu_decode_attention.py: the default
before the compiled forward), "no-kernels" (the compiled forward without the engine's C++
kernels, ops/cpu_kernels.cpp: oneDNN linears, inductor's decode attention; the default before
them), "dynamo" (the compiled forward with every graph called through dynamo and its
guards: the default before engine/model/direct_graph.py) and "compiled" (the
default on CPU: steps of decodes run engine/model/compiled_forward.py). Greedy tokens of
every path are compared: the ratio is only printed for paths that agree."""

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
from engine.model import compiled_forward
from engine.model_store import load_shared
from engine.ops import cpu_kernels

PATHS = {
    "eager": {"enforce_eager": True},
    "attention": {"enforce_eager": False},  # before the compiled forward: attention alone
    "no-kernels": {"enforce_eager": False},  # compiled, without ops/cpu_kernels.cpp
    "dynamo": {"enforce_eager": False},  # compiled, each graph call through dynamo's guards
    "compiled": {"enforce_eager": False},
}


def setup(model: str, args: dict, batch: int, context: int, steps: int) -> LLMEngine:
    eng = LLMEngine(
        EngineConfig.from_kwargs(model, max_num_seqs=batch, enable_prefix_caching=False, **args)
    )
    vocab = eng.runner.model.config.vocab_size
    gen = torch.Generator().manual_seed(0)
    params = SamplingParams(max_tokens=steps + 4, temperature=0.0, ignore_eos=True)
    for i in range(batch):
        prompt = torch.randint(0, vocab, (context,), generator=gen).tolist()
        eng.add(eng.make_request(f"r{i}", prompt, params))
    while eng.scheduler.num_waiting or any(not r.num_output_tokens for r in eng.scheduler.running):
        eng.step()  # prompts in; every sequence decodes from here on
    for _ in range(2):
        eng.step()  # warm-up: first decode steps pay for allocation
    return eng


def setup_path(name: str, model: str, batch: int, context: int, steps: int) -> LLMEngine:
    if name == "no-kernels":  # a model of its own, packed for oneDNN
        native, cpu_kernels.available = cpu_kernels.available, lambda: False
        load_shared.cache_clear()
        try:
            return setup(model, PATHS[name], batch, context, steps)
        finally:
            cpu_kernels.available = native
            load_shared.cache_clear()
    eng = setup(model, PATHS[name], batch, context, steps)
    if name == "attention":
        eng.runner.compiled_forward = False  # eager model, compiled decode attention
    return eng


def direct(on: bool) -> None:
    """Compiled graphs called directly once known (the default), or through dynamo each time."""
    for kind in compiled_forward.KINDS:
        compiled_forward._compiled(kind).direct = on


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--batch", type=int, nargs="+", default=[1, 8, 32, 64])
    p.add_argument("--context", type=int, default=128)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--paths", nargs="+", default=list(PATHS), choices=list(PATHS))
    args = p.parse_args()
    print(f"{args.model}, {torch.get_num_threads()} threads, context {args.context}, "
          f"{args.steps} decode steps per path, taken in turn")  # fmt: skip
    print(f"{'batch':>5} " + " ".join(f"{name + ' ms':>12}" for name in args.paths) + "  ratio")
    for batch in args.batch:
        engines = {
            n: setup_path(n, args.model, batch, args.context, args.steps) for n in args.paths
        }
        times: dict[str, list[float]] = {n: [] for n in args.paths}
        for _ in range(args.steps):
            for name, eng in engines.items():
                direct(name != "dynamo")
                t0 = time.perf_counter()
                eng.step()
                times[name].append(time.perf_counter() - t0)
            direct(True)
        tokens = {n: [r.token_ids for r in e.scheduler.running] for n, e in engines.items()}
        first = args.paths[0]
        agree = all(t == tokens[first] for t in tokens.values())
        med = {n: statistics.median(ts) * 1e3 for n, ts in times.items()}
        ratios = " ".join(f"{med[first] / med[n]:.2f}x" for n in args.paths[1:])
        cells = " ".join(f"{med[n]:12.1f}" for n in args.paths)
        print(f"{batch:5d} {cells}  {ratios if agree else 'TOKENS DIFFER: no ratio'}", flush=True)


if __name__ == "__main__":
    main()
