"""Per-layer, per-KV-head scales for an fp8 KV cache, calibrated once at start-up.

An fp8 cache needs its scales before the first token is written, and they cannot change
afterwards (earlier entries were written with them). vLLM reads them from the checkpoint or
uses 1.0; we measure them: one prefill of a fixed text in the model's own dtype, and each
head's largest |K| or |V| maps to 448 / KV_SCALE_HEADROOM. The text is fixed, so the scales
are the same in every engine on one model: greedy output stays deterministic across settings."""

from __future__ import annotations

import torch

from engine.config import ModelConfig
from engine.model.llama import LlamaForCausalLM
from engine.model.tokenizer import Tokenizer
from engine.ops.fp8 import FP8_MAX

# Room for K/V larger than the calibration text's: e4m3 keeps ~2 significant bits per
# value at any magnitude above 2**-6 * scale, so headroom costs nothing but range at the
# bottom. benchmarks/fp8_accuracy.py compares choices.
KV_SCALE_HEADROOM = 2.0
CALIBRATION_TOKENS = 512

CALIBRATION_TEXT = """\
The committee met on Tuesday, 14 March, to review the quarterly figures. Revenue rose 7.3%
to $41.2 million, while operating costs fell slightly; the board approved a dividend of
$0.18 per share. "We are cautiously optimistic," said the chair, "but supply chains remain
fragile." Questions from the floor concerned the new plant in Rotterdam and the delay of
the software upgrade, which is now expected in the autumn.

User: Can you explain how a hash map works?
Assistant: A hash map stores key-value pairs in an array of buckets. A hash function turns
each key into an index; collisions are resolved by chaining or open addressing. Lookups
take O(1) time on average, O(n) in the worst case.

def fibonacci(n: int) -> list[int]:
    seq = [0, 1]
    while len(seq) < n:
        seq.append(seq[-1] + seq[-2])
    return seq[:n]

for i, value in enumerate(fibonacci(10)):
    print(f"{i:>2}: {value}")

Les feuilles tombaient lentement sur le chemin du parc. Im Winter ist der See oft gefroren,
und die Kinder laufen Schlittschuh. 東京は日本の首都です。 Water boils at 100 °C at sea
level; at 3,000 m it boils near 90 °C. The derivative of x^2 is 2x, and the integral of
1/x is ln|x| + C. SELECT name, COUNT(*) FROM orders GROUP BY name HAVING COUNT(*) > 5;
Once upon a time, in a small village by the sea, there lived an old fisherman who spoke to
the gulls every morning before he set out. One day a gull answered him.
"""


def calibration_token_ids(tokenizer: Tokenizer | None, vocab_size: int) -> list[int]:
    """The text's tokens, repeated up to CALIBRATION_TOKENS; seeded random ids for models
    without a tokenizer (the tiny test configs)."""
    if tokenizer is None:
        g = torch.Generator().manual_seed(0)
        return torch.randint(0, vocab_size, (CALIBRATION_TOKENS,), generator=g).tolist()
    ids = tokenizer.encode(CALIBRATION_TEXT)
    return (ids * (CALIBRATION_TOKENS // len(ids) + 1))[:CALIBRATION_TOKENS]


@torch.inference_mode()
def calibrate_kv_scales(
    model: LlamaForCausalLM,
    model_config: ModelConfig,
    token_ids: list[int],
    block_size: int,
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(k_scale, v_scale) per layer, each float32 [kv_heads, 1, 1]."""
    from engine.runner import ModelRunner  # the runner imports this module's users

    token_ids = token_ids[: model_config.max_position_embeddings]
    model.prepare(len(token_ids))  # an engine with a shorter max_model_len built a shorter table
    num_blocks = -(-len(token_ids) // block_size)
    runner = ModelRunner(model, model_config, num_blocks, block_size, seed=0)
    runner.prefill(token_ids, list(range(num_blocks)), chunk_size=len(token_ids))
    scales = []
    n = len(token_ids)
    for cache in runner.kv_caches:
        pair = []
        for t in (cache.k, cache.v):
            heads, _, _, head_dim = t.shape
            amax = t.view(heads, -1, head_dim)[:, :n].float().abs().amax(dim=(1, 2))
            pair.append((amax.clamp(min=1e-6) * KV_SCALE_HEADROOM / FP8_MAX).view(heads, 1, 1))
        scales.append((pair[0], pair[1]))
    return scales
