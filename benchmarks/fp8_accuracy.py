"""What FP8 costs in accuracy: the model in its own dtype vs fp8 weights, fp8 KV cache, both.

For each variant: perplexity of the held-out text bench_cli/claims/data/heldout.txt, mean KL
divergence of its next-token distributions from the baseline's and top-1 agreement with the
baseline (all from bench_cli.claims.accuracy: through the engine's paged cache in 256-token
chunks, so later chunks read earlier K/V back from the cache), and how many greedy tokens it
generates identically to the baseline on chat prompts.

    python benchmarks/fp8_accuracy.py [--model smollm2-135m] [--dtype auto] [--scale-study]

--scale-study adds fp8-KV rows with other scales: one per layer, vLLM's default 1.0 (no
checkpoint scales), ours x1.41 (same range, other rounding), ours /16 (too small: clips).
e4m3 is a float format, so a scale sets the range, not the resolution: rows that do not clip
differ only by which values happen to round which way."""

from __future__ import annotations

import argparse
import gc
import time
from collections.abc import Callable

import torch

from bench_cli.claims.accuracy import CHUNK, heldout_text, metrics, score
from engine import LLM, SamplingParams
from engine.ops.fp8 import FP8_MAX

CHAT_PROMPTS = [
    "What is the capital of France, and what is it famous for?",
    "Write a Python function that reverses a linked list.",
    "Explain photosynthesis to a ten-year-old.",
    "Give me three tips for a job interview.",
    "What causes the seasons on Earth?",
    "Translate 'good morning, how are you?' into Spanish and German.",
    "Summarize the plot of Romeo and Juliet in two sentences.",
    "How do I make a cup of green tea?",
]
GEN_TOKENS = 64


def rescale(fn: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[LLM], None]:
    """Replace every layer's calibrated K and V scales with fn(scale)."""

    def adjust(llm: LLM) -> None:
        for cache in llm.llm_engine.runner.kv_caches:
            cache.k_scale, cache.v_scale = fn(cache.k_scale), fn(cache.v_scale)

    return adjust


SCALE_STUDY = [
    ("fp8 KV, scale per layer", rescale(lambda s: s.amax().expand_as(s).clone())),
    ("fp8 KV, scale 1.0", rescale(torch.ones_like)),
    ("fp8 KV, ours x1.41", rescale(lambda s: s * 2**0.5)),
    ("fp8 KV, ours /16 (clips)", rescale(lambda s: s / 16)),
]


def greedy(llm: LLM, prompts: list[str]) -> list[list[int]]:
    params = SamplingParams(max_tokens=GEN_TOKENS, temperature=0.0, ignore_eos=True)
    return [list(o.outputs[0].token_ids) for o in llm.generate(prompts, params)]


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--scale-study", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    variants: list[tuple[str, dict, Callable[[LLM], None] | None]] = [
        ("baseline", {}, None),
        ("bf16 KV", {"kv_cache_dtype": "bfloat16"}, None),
        ("fp8 weights", {"quantization": "fp8"}, None),
        ("fp8 KV", {"kv_cache_dtype": "fp8"}, None),
        ("fp8 weights + KV", {"quantization": "fp8", "kv_cache_dtype": "fp8"}, None),
    ]
    if args.scale_study:
        variants += [(label, {"kv_cache_dtype": "fp8"}, fn) for label, fn in SCALE_STUDY]

    base_lp: torch.Tensor | None = None
    base_gen: list[list[int]] = []
    rows = []
    for label, kwargs, adjust in variants:
        t0 = time.perf_counter()
        llm = LLM(args.model, dtype=args.dtype, max_num_batched_tokens=CHUNK, **kwargs)
        tok = llm.get_tokenizer()
        assert tok is not None, "the accuracy benchmark needs a model with a tokenizer"
        ids = tok.encode(heldout_text())
        prompts = [tok.apply_chat_template([{"role": "user", "content": p}]) for p in CHAT_PROMPTS]
        if adjust is not None:
            adjust(llm)
        lp, gen = score(llm, ids), greedy(llm, prompts)
        if base_lp is None:
            base_lp, base_gen = lp, gen
        acc = metrics(lp, ids, base_lp)
        match = [common_prefix(g, b) for g, b in zip(gen, base_gen, strict=True)]
        e = llm.llm_engine
        rows.append(
            (
                label,
                e.config.dtype,
                e.config.cache.kv_cache_dtype,
                e.weight_bytes / 2**20,
                acc["perplexity"],
                acc["mean_kl"],
                acc["top1_agreement"],
                sum(match) / len(match),
                sum(m == GEN_TOKENS for m in match),
                time.perf_counter() - t0,
            )
        )
        print(f"  {label}: done in {rows[-1][-1]:.0f} s", flush=True)
        del llm, e
        gc.collect()

    print(
        f"\n{args.model}, eval text {len(ids)} tokens in {CHUNK}-token chunks, "
        f"{len(CHAT_PROMPTS)} chat prompts x {GEN_TOKENS} greedy tokens, "
        f"{torch.get_num_threads()} threads; e4m3 max {FP8_MAX:.0f}"
    )
    head = (
        f"{'variant':<26}{'dtype':>9}{'KV':>10}{'weights MiB':>13}{'ppl':>9}{'ppl +%':>8}"
        f"{'KL':>9}{'top-1':>8}{'greedy match':>14}{'all 64':>8}"
    )
    print(head)
    base_ppl = rows[0][4]
    for label, dtype, kv, mib, ppl, kl, top1, mean_match, full, _ in rows:
        print(
            f"{label:<26}{dtype:>9}{kv:>10}{mib:>13.1f}{ppl:>9.3f}"
            f"{(ppl / base_ppl - 1) * 100:>+8.2f}{kl:>9.5f}{top1:>8.3f}"
            f"{mean_match:>14.1f}{full:>5}/{len(CHAT_PROMPTS)}"
        )


if __name__ == "__main__":
    main()
