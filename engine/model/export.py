"""Write a loaded model as a Hugging Face directory (config.json, model.safetensors,
tokenizer.json, tokenizer_config.json): the same weights for another server.

Other engines compared against ours need the identical model, and vLLM's CPU build cannot
run the GGUF file the default model ships as (its GGUF kernels are CUDA-only). The export
is the inverse of `LlamaForCausalLM.load_hf_weights`: fused qkv and gate_up are split back,
Q/K stay in Hugging Face's rotary layout (the GGUF permutation was undone at load)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from engine.model.loader import LoadedModel
from engine.model.tokenizer import Tokenizer
from engine.ops.cpu_linear import PackedLinear
from engine.ops.fp8 import Fp8Linear

DTYPE_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}


def hf_state_dict(loaded: LoadedModel) -> dict[str, torch.Tensor]:
    model, cfg = loaded.model, loaded.config
    if any(isinstance(m, Fp8Linear | PackedLinear) for m in model.modules()):
        raise ValueError("export a model as loaded: before fp8 quantization or CPU packing")
    q, kv = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    ffn = cfg.intermediate_size
    out = {
        "model.embed_tokens.weight": model.embed_tokens.weight,
        "model.norm.weight": model.norm.weight,
    }
    if not cfg.tie_word_embeddings:
        out["lm_head.weight"] = model.lm_head.weight
    for i, layer in enumerate(model.layers):
        attn, mlp, p = layer.self_attn, layer.mlp, f"model.layers.{i}."
        qkv, gate_up = attn.qkv_proj.weight, mlp.gate_up_proj.weight
        out |= {
            p + "self_attn.q_proj.weight": qkv[:q],
            p + "self_attn.k_proj.weight": qkv[q : q + kv],
            p + "self_attn.v_proj.weight": qkv[q + kv :],
            p + "self_attn.o_proj.weight": attn.o_proj.weight,
            p + "mlp.gate_proj.weight": gate_up[:ffn],
            p + "mlp.up_proj.weight": gate_up[ffn:],
            p + "mlp.down_proj.weight": mlp.down_proj.weight,
            p + "input_layernorm.weight": layer.input_layernorm.weight,
            p + "post_attention_layernorm.weight": layer.post_attention_layernorm.weight,
        }
    return {k: v.detach().contiguous().cpu() for k, v in out.items()}


def hf_config(loaded: LoadedModel) -> dict[str, Any]:
    """The model's config.json in Hugging Face's Llama names (also what transformers'
    `LlamaConfig` takes)."""
    cfg = loaded.config
    dtype = loaded.model.embed_tokens.weight.dtype
    eos = list(cfg.eos_token_ids)
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": cfg.num_kv_heads,
        "head_dim": cfg.head_dim,
        "hidden_act": "silu",
        "rope_theta": cfg.rope_theta,
        "rms_norm_eps": cfg.rms_norm_eps,
        "max_position_embeddings": cfg.max_position_embeddings,
        "tie_word_embeddings": cfg.tie_word_embeddings,
        "bos_token_id": cfg.bos_token_id,
        "eos_token_id": eos[0] if len(eos) == 1 else eos or None,
        "torch_dtype": DTYPE_NAMES[dtype],
    }


def export_hf_dir(loaded: LoadedModel, path: str | Path) -> Path:
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    config = hf_config(loaded)
    (path / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    save_file(hf_state_dict(loaded), str(path / "model.safetensors"), metadata={"format": "pt"})
    if loaded.tokenizer is not None:
        export_tokenizer(loaded.tokenizer, path)
    return path


def export_tokenizer(tok: Tokenizer, path: str | Path) -> Path:
    """tokenizer.json and tokenizer_config.json (special tokens, chat template) in `path`."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tok.tokenizer.save(str(path / "tokenizer.json"))

    def token(i: int | None) -> str | None:
        return None if i is None else tok.tokenizer.id_to_token(i)

    tok_config = {
        "bos_token": token(tok.bos_token_id),
        "eos_token": token(tok.eos_token_ids[0] if tok.eos_token_ids else None),
        "add_bos_token": tok.add_bos,
        "chat_template": tok.chat_template,
        "tokenizer_class": "PreTrainedTokenizerFast",
    }
    (path / "tokenizer_config.json").write_text(json.dumps(tok_config, indent=2) + "\n")
    return path
