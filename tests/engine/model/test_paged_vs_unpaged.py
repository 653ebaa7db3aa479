"""The paged engine computes exactly what a plain, contiguous causal forward pass computes."""

import torch
import torch.nn.functional as F

from engine import LLM, SamplingParams
from engine.model.llama import LlamaForCausalLM
from engine.ops import apply_rotary


def unpaged_logits(model: LlamaForCausalLM, ids: list[int]) -> torch.Tensor:
    """Reference: the whole sequence at once, K/V in plain tensors, causal SDPA."""
    cfg = model.config
    assert model.cos_sin is not None
    t = len(ids)
    x = model.embed_tokens(torch.tensor(ids))
    cos_sin = model.cos_sin[:t]
    for layer in model.layers:
        attn = layer.self_attn
        h = layer.input_layernorm(x)
        q, k, v = attn.qkv_proj(h).split([attn.q_size, attn.kv_size, attn.kv_size], dim=-1)
        q = apply_rotary(q.view(t, cfg.num_heads, cfg.head_dim), cos_sin).transpose(0, 1)
        k = apply_rotary(k.view(t, cfg.num_kv_heads, cfg.head_dim), cos_sin).transpose(0, 1)
        v = v.view(t, cfg.num_kv_heads, cfg.head_dim).transpose(0, 1)
        rep = cfg.num_heads // cfg.num_kv_heads
        k, v = k.repeat_interleave(rep, 0), v.repeat_interleave(rep, 0)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(0, 1).reshape(t, -1)
        x = x + attn.o_proj(o)
        x = x + layer.mlp(layer.post_attention_layernorm(x))
    return model.compute_logits(model.norm(x))


def unpaged_greedy(model: LlamaForCausalLM, prompt: list[int], n: int) -> list[int]:
    ids = list(prompt)
    with torch.inference_mode():
        for _ in range(n):
            ids.append(int(unpaged_logits(model, ids)[-1].argmax()))
    return ids[len(prompt) :]


def test_tiny_model_paged_equals_unpaged_greedy() -> None:
    for name in ("tiny-llama", "tiny-llama-untied"):
        llm = LLM(
            name, dtype="float32", max_num_seqs=8, num_kv_blocks=128, max_num_batched_tokens=64
        )
        g = torch.Generator().manual_seed(1)
        prompts = [
            torch.randint(2, 512, (n,), generator=g).tolist() for n in (1, 5, 16, 17, 40, 100)
        ]
        params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
        outs = llm.generate(prompts, params)
        model = llm.llm_engine.runner.model
        for prompt, out in zip(prompts, outs, strict=True):
            assert out.outputs[0].token_ids == unpaged_greedy(model, prompt, 24), name
