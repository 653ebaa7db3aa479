"""Claim 5, "FP8 ... with zero measurable loss": perplexity of a held-out text, mean KL
divergence and top-1 agreement of each variant (fp8 weights, fp8 KV cache, ...) against the
model in its own dtype.

Scores go through the engine's paged KV cache (`LLMEngine.prompt_logits`) in chunks, as a long
prompt would: later chunks read earlier K/V back from the cache in its dtype and scales."""

from __future__ import annotations

import gc
import math
from importlib import resources
from typing import Any

import torch

from engine import LLM

CHUNK = 256  # tokens per prefill chunk while scoring


def heldout_text() -> str:
    """The held-out English text (~1,300 SmolLM2 tokens), installed with the package."""
    return resources.files("bench_cli.claims").joinpath("data/heldout.txt").read_text()


def score(llm: LLM, ids: list[int], chunk: int = CHUNK) -> torch.Tensor:
    """Float32 log-probabilities [len(ids), vocab] of the token after each of `ids`."""
    return llm.llm_engine.prompt_logits(ids, chunk).log_softmax(-1)


def metrics(logprobs: torch.Tensor, ids: list[int], base: torch.Tensor) -> dict[str, float]:
    """Perplexity of ids[1:] under `logprobs`, and its agreement with the baseline's log-probs
    `base` over the same positions (the last one, which predicts past the text, is left out)."""
    lp, bp = logprobs[:-1], base[:-1]
    target = torch.tensor(ids[1:])[:, None]
    nll = -lp.gather(1, target).mean().item()
    return {
        "perplexity": math.exp(nll),
        "top1_agreement": (bp.argmax(-1) == lp.argmax(-1)).float().mean().item(),
        "mean_kl": (bp.exp() * (bp - lp)).sum(-1).mean().item(),  # KL(baseline || variant)
        "tokens": len(ids) - 1,
    }


def compare(
    model: str,
    variants: dict[str, dict[str, Any]],
    text: str | None = None,
    max_tokens: int | None = None,
) -> dict[str, dict[str, float]]:
    """Per variant label: perplexity, top1_agreement (share of positions whose argmax is the
    baseline's), mean_kl (nats, KL(baseline || variant)) and tokens (positions scored).

    `variants` maps a label to engine kwargs; the first is the baseline. `text` defaults to the
    held-out text; `max_tokens` keeps its first tokens (also capped to the model's context).
    Engine kwargs default to max_num_batched_tokens=CHUNK and enforce_eager=True (scoring
    never decodes). One LLM at a time: each is freed before the next is built."""
    if not variants:
        raise ValueError("give at least one variant (the first is the baseline)")
    text = heldout_text() if text is None else text
    base: torch.Tensor | None = None
    ids: list[int] = []
    out: dict[str, dict[str, float]] = {}
    for label, kwargs in variants.items():
        # Scoring runs prefills only: the compiled decode kernel would cost seconds for nothing.
        llm = LLM(model, **{"max_num_batched_tokens": CHUNK, "enforce_eager": True, **kwargs})
        if not ids:
            tok = llm.get_tokenizer()
            if tok is None:
                raise ValueError(f"model {model!r} has no tokenizer to encode the text with")
            ids = tok.encode(text)[: min(max_tokens or 2**62, llm.llm_engine.max_model_len)]
            if len(ids) < 2:
                raise ValueError("the text must hold at least 2 tokens")
        lp = score(llm, ids)
        del llm
        gc.collect()
        if base is None:
            base = lp
        out[label] = metrics(lp, ids, base)
    return out
