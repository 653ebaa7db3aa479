"""Decode tok/s of float32 and bfloat16 side by side in one process: float32 (the engine's
kernels), bf16 through torch's linears (the path before servebench::linear_bf16) and bf16
through the engine's bf16 kernel (engine/ops/cpu_kernels_bf16.cpp).

    python benchmarks/bf16_decode.py                      # B = 1, 8, 32; 128-token prompts
    python benchmarks/bf16_decode.py --batch 8 --rounds 5 --steps-per-round 10

The three engines share nothing but the process; each holds B sequences of `--context`
random prompt tokens, prefilled before timing. Rounds alternate between the paths (a round:
`--steps-per-round` decode steps of one path, then of the next), so a busy machine slows them
alike; each round prints each path's decode tok/s (B tokens a step), then the medians and the
ratios to float32 and to bf16-torch. Greedy tokens of the two bf16 paths are compared and
their agreement printed (bf16 rounds differently in the two products: identical tokens are
not expected everywhere). Needs a CPU with AVX512-BF16 for the kernel's path (else it is left
out, and said so)."""

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
from engine.model_store import load_shared
from engine.ops import cpu_kernels

PATHS = ("float32", "bf16-torch", "bf16-kernel")


def setup(model: str, path: str, batch: int, context: int, steps: int) -> LLMEngine:
    dtype = "float32" if path == "float32" else "bfloat16"
    native = cpu_kernels.bf16_available
    if path == "bf16-torch":  # a model of its own, its linears left as torch's
        cpu_kernels.bf16_available = lambda: False
    try:
        eng = LLMEngine(
            EngineConfig.from_kwargs(
                model, dtype=dtype, max_num_seqs=batch, enable_prefix_caching=False
            )
        )
    finally:
        cpu_kernels.bf16_available = native
    want = {"float32": "kernel", "bf16-torch": "torch", "bf16-kernel": "bf16 kernel"}[path]
    if eng.linears != want:
        raise RuntimeError(f"{path}: the engine's linears are {eng.linears!r}, not {want!r}")
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


def agreement(a: list[list[int]], b: list[list[int]]) -> float:
    """Share of output positions where two runs' greedy tokens are equal (up to the first
    difference of each sequence: after it the contexts differ)."""
    same = total = 0
    for x, y in zip(a, b, strict=True):
        n = next(
            (i for i, (p, q) in enumerate(zip(x, y, strict=False)) if p != q), min(len(x), len(y))
        )
        same, total = same + n, total + max(len(x), len(y))
    return same / max(total, 1)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--batch", type=int, nargs="+", default=[1, 8, 32])
    p.add_argument("--context", type=int, default=128)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps-per-round", type=int, default=10)
    args = p.parse_args()
    paths = [n for n in PATHS if n != "bf16-kernel" or cpu_kernels.bf16_available()]
    if len(paths) < len(PATHS):
        print("this CPU runs no servebench::linear_bf16 (no AVX512-BF16): bf16-kernel left out")
    steps = args.rounds * args.steps_per_round
    print(f"{args.model}, {torch.get_num_threads()} threads, context {args.context}, {args.rounds} "
          f"rounds of {args.steps_per_round} decode steps per path, alternating")  # fmt: skip
    summary = []
    for batch in args.batch:
        engines = {n: setup(args.model, n, batch, args.context, steps) for n in paths}
        rounds: dict[str, list[float]] = {n: [] for n in paths}
        for r in range(args.rounds):
            order = paths if r % 2 == 0 else paths[::-1]
            for name in order:
                eng = engines[name]
                t0 = time.perf_counter()
                for _ in range(args.steps_per_round):
                    eng.step()
                rounds[name].append(batch * args.steps_per_round / (time.perf_counter() - t0))
            cells = "  ".join(f"{n} {rounds[n][-1]:7.1f}" for n in paths)
            print(f"B={batch:<3} round {r + 1}: {cells} tok/s", flush=True)
        med = {n: statistics.median(v) for n, v in rounds.items()}
        tokens = {
            n: [list(q.output_token_ids) for q in e.scheduler.running] for n, e in engines.items()
        }
        agree = agreement(tokens["bf16-torch"], tokens["bf16-kernel"]) if len(paths) == 3 else None
        summary.append((batch, med, agree))
        del engines
        load_shared.cache_clear()
    print(f"\n{'B':>3} " + "".join(f"{n + ' tok/s':>18}" for n in paths)
          + "  bf16-kernel/bf16-torch  bf16-kernel/float32  bf16 tokens agree")  # fmt: skip
    for batch, med, agree in summary:
        cells = "".join(f"{med[n]:18.1f}" for n in paths)
        k = med.get("bf16-kernel")
        ratios = f"{k / med['bf16-torch']:22.2f}x {k / med['float32']:19.2f}x" if k else ""
        agreed = f"{agree:18.1%}" if agree is not None else ""
        print(f"{batch:3d} {cells}  {ratios}  {agreed}")


if __name__ == "__main__":
    main()
