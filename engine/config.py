"""Engine configuration: one resolved `EngineConfig` is what every run records."""

from __future__ import annotations

import dataclasses
import logging
import math
from dataclasses import dataclass, field
from typing import Any, Literal

logger = logging.getLogger(__name__)

Batching = Literal["continuous", "static"]
KV_CACHE_DTYPES = ("auto", "bfloat16", "float32", "fp8", "fp8_e4m3")
KVReservation = Literal["paged", "max_len"]


@dataclass(slots=True)
class ModelConfig:
    """Shape of a Llama-family model, read from GGUF metadata, config.json or a tiny preset."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = True
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * dtype_bytes

    @classmethod
    def from_hf(cls, hf: dict[str, Any], eos: Any = None) -> ModelConfig:
        """A Hugging Face config.json's Llama-family shape; `eos`: generation_config.json's
        eos_token_id where it differs from config.json's."""
        heads = hf["num_attention_heads"]
        eos = hf.get("eos_token_id") if eos is None else eos
        return cls(
            vocab_size=hf["vocab_size"],
            hidden_size=hf["hidden_size"],
            intermediate_size=hf["intermediate_size"],
            num_layers=hf["num_hidden_layers"],
            num_heads=heads,
            num_kv_heads=hf.get("num_key_value_heads") or heads,
            head_dim=hf.get("head_dim") or hf["hidden_size"] // heads,
            rope_theta=float(hf.get("rope_theta", 10000.0)),
            rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
            max_position_embeddings=hf.get("max_position_embeddings", 2048),
            tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
            bos_token_id=hf.get("bos_token_id"),
            eos_token_ids=tuple(eos if isinstance(eos, list) else [] if eos is None else [eos]),
        )


@dataclass(slots=True)
class CacheConfig:
    block_size: int = 16
    num_kv_blocks: int | None = None  # wins over the memory budget when set
    kv_cache_memory_gb: float | None = None  # default: 2 GiB, capped to what max_num_seqs can use
    # auto: the model's dtype. fp8 (alias fp8_e4m3): e4m3 with calibrated per-head scales,
    # half of bf16's bytes, so the same memory budget holds twice the blocks.
    kv_cache_dtype: Literal["auto", "bfloat16", "float32", "fp8", "fp8_e4m3"] = "auto"
    # Reuse the KV of full blocks whose tokens (and every token before them) match a
    # computed block still in the pool; on by default, as in vLLM v1.
    enable_prefix_caching: bool = True
    # paged: blocks as tokens arrive. max_len: the baseline of a contiguous allocator
    # (HF/FasterTransformer-era serving): at admission a request reserves the blocks of a whole
    # max_model_len context and keeps them until it ends; no prefix caching (resolve turns it off).
    kv_reservation: KVReservation = "paged"


@dataclass(slots=True)
class SchedulerConfig:
    batching: Batching = "continuous"
    max_num_seqs: int = 64
    max_num_batched_tokens: int | None = (
        None  # default: 2048 chunked, else max(2048, max_model_len)
    )
    enable_chunked_prefill: bool = True
    long_prefill_token_threshold: int = 0  # >0 (chunked prefill only): cap on one prefill chunk
    # fcfs: arrival order (a request's priority is accepted and not used, as SGLang without
    # priority scheduling; vLLM refuses it). priority: (priority, arrival) order, lower first;
    # a waiting request may preempt a running one of lower priority (vLLM's policy names).
    scheduling_policy: Literal["fcfs", "priority"] = "fcfs"


SPEC_METHODS = ("ngram", "draft_layers")


@dataclass(slots=True)
class SpeculativeConfig:
    """vLLM's `speculative_config`. ngram: prompt lookup, proposals copied from the tokens
    after the latest earlier occurrence of the context's last n tokens (n from
    prompt_lookup_max down to prompt_lookup_min). draft_layers: a self-speculative draft, the
    first `num_draft_layers` layers of the model itself with its final norm and LM head
    (LayerSkip-style early exit; it shares those layers' KV cache with the target)."""

    method: Literal["ngram", "draft_layers"] = "ngram"
    num_speculative_tokens: int = 4
    prompt_lookup_min: int = 2
    prompt_lookup_max: int = 4
    num_draft_layers: int | None = None  # draft_layers; default: half the model's layers

    @classmethod
    def parse(
        cls, value: SpeculativeConfig | dict[str, Any] | str | None
    ) -> SpeculativeConfig | None:
        """From a dict (the LLM argument) or its JSON text (the CLI flag); None stays None."""
        if value is None or isinstance(value, SpeculativeConfig):
            return value
        if isinstance(value, str):
            import json

            try:
                value = json.loads(value)
            except json.JSONDecodeError as e:
                raise ValueError(f"speculative_config is not valid JSON: {e}") from None
        if not isinstance(value, dict):
            raise ValueError(f"speculative_config must be a JSON object, got {value!r}")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(value) - known)
        if unknown:
            raise ValueError(f"unknown speculative_config keys {unknown}; known: {sorted(known)}")
        cfg = cls(**value)
        cfg.validate()
        return cfg

    def validate(self) -> None:
        if self.method not in SPEC_METHODS:
            raise ValueError(
                f"speculative_config method must be one of {', '.join(SPEC_METHODS)}, "
                f"got {self.method!r}"
            )
        k = self.num_speculative_tokens
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"num_speculative_tokens must be an integer >= 1, got {k!r}")
        if not 1 <= self.prompt_lookup_min <= self.prompt_lookup_max:
            raise ValueError(
                "need 1 <= prompt_lookup_min <= prompt_lookup_max, got "
                f"{self.prompt_lookup_min}, {self.prompt_lookup_max}"
            )
        if self.num_draft_layers is not None and self.num_draft_layers < 1:
            raise ValueError(f"num_draft_layers must be >= 1, got {self.num_draft_layers}")


@dataclass(slots=True)
class EngineConfig:
    model: str = "smollm2-135m"
    dtype: Literal["auto", "bfloat16", "float32"] = "auto"  # auto: see engine.resolve_dtype
    device: str = "auto"
    quantization: Literal["fp8", "none"] | None = None  # fp8: e4m3 linears, per-channel scales
    seed: int = 0
    max_model_len: int | None = None  # default: the model's context length
    # dummy: the model's shape (a config.json, a built-in name, a GGUF's metadata) with random
    # weights, as vLLM's --load-format dummy: for timing models whose weights are not here.
    load_format: Literal["auto", "dummy"] = "auto"
    # False: on CPU, the decoder layers run compiled (engine/model/compiled_forward.py) and
    # decode attention reads K/V in place (engine/ops/cpu_decode_attention.py), compiled at
    # start-up. True: eager PyTorch only.
    enforce_eager: bool = False
    # Kernels of the attention layer (attention, cache write, rotary, norms). torch: the
    # PyTorch ops (engine/ops), compiled on CPU unless enforce_eager. triton: engine/ops/triton,
    # compiled on CUDA, in Triton's interpreter elsewhere (slow: for tests). auto: triton on
    # CUDA where triton is installed, else torch. Recorded as resolved.
    attention_backend: Literal["auto", "torch", "triton"] = "auto"
    # CUDA graphs of decode-only steps, one per batch-size bucket (engine/cuda_graphs.py):
    # CUDA and the triton backend only; off until measured on a GPU (benchmarks/gpu_check.sh).
    cuda_graphs: bool = False
    # Tensor parallelism (engine/distributed): the weights split over this many processes.
    tensor_parallel_size: int = 1
    # Speculative decoding (engine/spec_decode): None is off.
    speculative_config: SpeculativeConfig | None = None
    cache: CacheConfig = field(default_factory=CacheConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)

    @classmethod
    def from_kwargs(cls, model: str, **kwargs: Any) -> EngineConfig:
        """Build from vLLM-style flat engine args (`max_num_seqs=8, block_size=16, ...`)."""
        cfg = cls(model=model)
        for name, value in kwargs.items():
            target = next(
                (o for o in (cfg, cfg.cache, cfg.scheduler) if name in _arg_names(o)), None
            )
            if target is None:
                raise TypeError(
                    f"unknown engine argument {name!r}; known: {sorted(engine_arg_names())}"
                )
            if name == "speculative_config":
                value = SpeculativeConfig.parse(value)
            setattr(target, name, value)
        cfg.validate()
        return cfg

    def validate(self) -> None:
        s, c = self.scheduler, self.cache
        if s.scheduling_policy not in ("fcfs", "priority"):
            raise ValueError(
                f"scheduling_policy must be 'fcfs' or 'priority', got {s.scheduling_policy!r}"
            )
        if s.batching not in ("continuous", "static"):
            raise ValueError(f"batching must be 'continuous' or 'static', got {s.batching!r}")
        if self.attention_backend not in ("auto", "torch", "triton"):
            raise ValueError(
                "attention_backend must be 'auto', 'torch' or 'triton', "
                f"got {self.attention_backend!r}"
            )
        if self.load_format not in ("auto", "dummy"):
            raise ValueError(f"load_format must be 'auto' or 'dummy', got {self.load_format!r}")
        if self.dtype not in ("auto", "bfloat16", "float32"):
            raise ValueError(f"dtype must be 'auto', 'bfloat16' or 'float32', got {self.dtype!r}")
        if c.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(
                f"kv_cache_dtype must be one of {', '.join(KV_CACHE_DTYPES)}, "
                f"got {c.kv_cache_dtype!r}"
            )
        if c.kv_reservation not in ("paged", "max_len"):
            raise ValueError(
                f"kv_reservation must be 'paged' or 'max_len', got {c.kv_reservation!r}"
            )
        if c.kv_cache_dtype == "fp8_e4m3":
            c.kv_cache_dtype = "fp8"
        if self.quantization == "none":  # a profile's sweep list cannot hold TOML's missing null
            self.quantization = None
        if self.quantization not in (None, "fp8"):
            raise ValueError(f"quantization must be 'fp8' or unset, got {self.quantization!r}")
        for name, value in (("max_num_seqs", s.max_num_seqs), ("block_size", c.block_size)):
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        if s.max_num_batched_tokens is not None and s.max_num_batched_tokens < 1:
            raise ValueError("max_num_batched_tokens must be >= 1")
        if c.num_kv_blocks is not None and c.num_kv_blocks < 1:
            raise ValueError("num_kv_blocks must be >= 1")
        tp = self.tensor_parallel_size
        if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
            raise ValueError(f"tensor_parallel_size must be an integer >= 1, got {tp!r}")
        if s.long_prefill_token_threshold < 0:
            raise ValueError("long_prefill_token_threshold must be >= 0")

    def resolve(self, model_config: ModelConfig, kv_dtype_bytes: int) -> None:
        """Fill the defaults that depend on the model: context length, token budget, KV blocks."""
        if self.max_model_len is None:
            self.max_model_len = model_config.max_position_embeddings
        spec = self.speculative_config
        if spec is not None and spec.method == "draft_layers":
            if spec.num_draft_layers is None:
                spec.num_draft_layers = max(1, model_config.num_layers // 2)  # recorded
            if spec.num_draft_layers >= model_config.num_layers:
                raise ValueError(
                    f"num_draft_layers={spec.num_draft_layers} must be fewer than the model's "
                    f"{model_config.num_layers} layers"
                )
        s, c = self.scheduler, self.cache
        if s.max_num_batched_tokens is None:
            s.max_num_batched_tokens = (
                2048 if s.enable_chunked_prefill else max(2048, self.max_model_len)
            )
        if not s.enable_chunked_prefill and s.max_num_batched_tokens < self.max_model_len:
            # vLLM refuses this config; we allow it (a sweep may want it) but say what it does.
            logger.warning(
                "chunked prefill is off and max_num_batched_tokens=%d < max_model_len=%d: "
                "prompts over %d tokens will be rejected",
                s.max_num_batched_tokens,
                self.max_model_len,
                s.max_num_batched_tokens,
            )
        if c.kv_reservation == "max_len" and c.enable_prefix_caching:
            # A contiguous reservation holds its own copy of every token: nothing to share.
            logger.info("kv_reservation=max_len: prefix caching is off")
            c.enable_prefix_caching = False
        if c.num_kv_blocks is None:
            block_bytes = c.block_size * model_config.kv_bytes_per_token(kv_dtype_bytes)
            budget_gb = 2.0 if c.kv_cache_memory_gb is None else c.kv_cache_memory_gb
            by_memory = int(budget_gb * 2**30 // block_bytes)
            if by_memory < 1:
                raise ValueError(
                    f"kv_cache_memory_gb={budget_gb} holds no {c.block_size}-token block "
                    f"({block_bytes} bytes each)"
                )
            by_need = s.max_num_seqs * math.ceil(self.max_model_len / c.block_size)
            c.num_kv_blocks = (
                by_memory if c.kv_cache_memory_gb is not None else min(by_memory, by_need)
            )
        reserved = math.ceil(self.max_model_len / c.block_size)
        if c.kv_reservation == "max_len" and reserved > c.num_kv_blocks:
            logger.warning(
                "kv_reservation=max_len reserves %d KV blocks a request, more than the %d in "
                "the cache: every request will be refused",
                reserved,
                c.num_kv_blocks,
            )

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _arg_names(obj: Any) -> set[str]:
    return {f.name for f in dataclasses.fields(obj)} - {"cache", "scheduler", "model"}


def engine_arg_names() -> set[str]:
    """The flat engine-argument names shared by `LLM(...)` and `bench serve` flags."""
    return set().union(*(_arg_names(c) for c in (EngineConfig, CacheConfig, SchedulerConfig)))
