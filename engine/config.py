"""Engine configuration: one resolved `EngineConfig` is what every run records."""

from __future__ import annotations

import dataclasses
import logging
import math
import typing
from dataclasses import dataclass, field
from typing import Any, Literal

logger = logging.getLogger(__name__)


def setting(default: Any = None, help: str = "", factory: Any = None) -> Any:
    """An engine setting: its default and its one-line help, declared once. The CLI options of
    every command that starts the engine, the server's /metrics labels, the choices validate()
    accepts (from the field's Literal type) and the docs' table are derived from these fields."""
    if factory is not None:
        return field(default_factory=factory, metadata={"help": help})
    return field(default=default, metadata={"help": help})


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
    block_size: int = setting(16, "tokens per KV block")
    num_kv_blocks: int | None = setting(None, "KV blocks (wins over the memory budget)")
    kv_cache_memory_gb: float | None = setting(
        None, "KV-cache memory budget in GiB (default 2, capped to what max_num_seqs can use)"
    )
    # fp8 (alias fp8_e4m3): e4m3 with calibrated per-head scales, half of bf16's bytes, so the
    # same memory budget holds twice the blocks.
    kv_cache_dtype: Literal["auto", "bfloat16", "float32", "fp8", "fp8_e4m3"] = setting(
        "auto", "KV cache dtype (auto: the model's; fp8: e4m3 with per-head scales)"
    )
    # On by default, as in vLLM v1.
    enable_prefix_caching: bool = setting(
        True, "reuse the KV of cached prompt prefixes (full blocks)"
    )
    # max_len: the baseline of a contiguous allocator (HF/FasterTransformer-era serving);
    # resolve() turns prefix caching off under it.
    kv_reservation: KVReservation = setting(
        "paged",
        "paged: blocks as tokens arrive; max_len (baseline): each request reserves a whole "
        "max_model_len context at admission, no prefix caching",
    )


@dataclass(slots=True)
class SchedulerConfig:
    batching: Batching = setting("continuous", "continuous or static batching")
    max_num_seqs: int = setting(64, "requests running at once")
    max_num_batched_tokens: int | None = setting(
        None, "token budget of one step (default 2048 chunked, else max(2048, max_model_len))"
    )
    enable_chunked_prefill: bool = setting(True, "cut long prompts into chunks")
    long_prefill_token_threshold: int = setting(
        0, "cap on one prefill chunk (chunked prefill only; 0: off)"
    )
    # fcfs: a request's priority is accepted and not used, as SGLang without priority
    # scheduling (vLLM refuses it). Policy names as vLLM's.
    scheduling_policy: Literal["fcfs", "priority"] = setting(
        "fcfs", "fcfs | priority (lower priority value first, with preemption)"
    )


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
    dtype: Literal["auto", "bfloat16", "float32"] = setting(
        "auto", "weights and activations (auto: see engine.resolve_dtype)"
    )
    device: str = setting("auto", "auto | cpu | cuda")
    quantization: Literal["fp8", "none"] | None = setting(
        None, "fp8: e4m3 linear weights, per-channel scales"
    )
    seed: int = setting(0, "seeds sampling")
    max_model_len: int | None = setting(
        None, "longest prompt + output (default: the model's context length)"
    )
    # dummy, as vLLM's --load-format dummy: for timing models whose weights are not here.
    load_format: Literal["auto", "dummy"] = setting(
        "auto", "auto | dummy: random weights of the model's shape (any config.json), for timing"
    )
    # False: on CPU, the decoder layers run compiled (engine/model/compiled_forward.py) and
    # decode attention reads K/V in place (engine/ops/cpu_decode_attention.py).
    enforce_eager: bool = setting(
        False, "eager PyTorch only: no compiled CPU forward or decode attention"
    )
    # torch: the PyTorch ops (engine/ops), compiled on CPU unless enforce_eager. triton:
    # engine/ops/triton, compiled on CUDA, in Triton's interpreter elsewhere (slow: for tests).
    # Recorded as resolved.
    attention_backend: Literal["auto", "torch", "triton"] = setting(
        "auto",
        "the attention layer's kernels (auto: triton on CUDA; triton without CUDA runs "
        "Triton's interpreter, slow)",
    )
    # One graph per batch-size bucket (engine/cuda_graphs.py); off until measured on a GPU
    # (benchmarks/gpu_check.sh).
    cuda_graphs: bool = setting(
        False, "CUDA graphs of decode steps (CUDA, --attention-backend triton; unmeasured)"
    )
    tensor_parallel_size: int = setting(
        1, "processes the weights are split over (gloo on CPU, NCCL on CUDA)"
    )
    speculative_config: SpeculativeConfig | None = setting(
        None,
        'speculative decoding as vLLM takes it, JSON: \'{"method": "ngram", '
        '"num_speculative_tokens": 4}\' (prompt_lookup_min/max) or \'{"method": '
        '"draft_layers", "num_speculative_tokens": 3, "num_draft_layers": 24}\'',
    )
    cache: CacheConfig = field(default_factory=CacheConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)

    @classmethod
    def from_kwargs(cls, model: str, **kwargs: Any) -> EngineConfig:
        """Build from vLLM-style flat engine args (`max_num_seqs=8, block_size=16, ...`)."""
        cfg = cls(model=model)
        for name, value in kwargs.items():
            if name not in ENGINE_SETTINGS:
                raise TypeError(
                    f"unknown engine argument {name!r}; known: {sorted(engine_arg_names())}"
                )
            if name == "speculative_config":
                value = SpeculativeConfig.parse(value)
            setattr(cfg.holder(name), name, value)
        cfg.validate()
        return cfg

    def validate(self) -> None:
        s, c = self.scheduler, self.cache
        if c.kv_cache_dtype == "fp8_e4m3":
            c.kv_cache_dtype = "fp8"
        if self.quantization == "none":  # a profile's sweep list cannot hold TOML's missing null
            self.quantization = None
        values = self.flat()
        for name, spec in ENGINE_SETTINGS.items():
            if spec.choices and values[name] not in spec.choices:
                allowed = [repr(c) if c is not None else "unset" for c in spec.choices]
                listed = " or ".join(
                    [", ".join(allowed[:-1]), allowed[-1]] if allowed[1:] else allowed
                )
                raise ValueError(f"{name} must be {listed}, got {values[name]!r}")
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

    def flat(self) -> dict[str, Any]:
        """Every setting by its flat name (as `LLM(...)` and the CLI take it)."""
        return {name: getattr(self.holder(name), name) for name in ENGINE_SETTINGS}

    def holder(self, name: str) -> Any:
        """The object that holds setting `name`: this config, its cache or its scheduler."""
        section = ENGINE_SETTINGS[name].section
        return self if section == "engine" else getattr(self, section)


@dataclass(frozen=True, slots=True)
class Setting:
    """One engine setting as its field declares it: where it lives, its resolved type, its
    default and help; the choices of a Literal type (None among them where it may be unset)."""

    name: str
    section: str  # "engine", "cache" or "scheduler": the object that holds it
    type: Any
    default: Any
    help: str

    @property
    def choices(self) -> tuple[Any, ...]:
        return _literal_values(self.type)

    @property
    def optional(self) -> bool:
        return type(None) in typing.get_args(self.type)


def _literal_values(tp: Any) -> tuple[Any, ...]:
    if typing.get_origin(tp) is Literal:
        return typing.get_args(tp)
    values = [v for arg in typing.get_args(tp) for v in _literal_values(arg)]
    if values and type(None) in typing.get_args(tp):
        values.append(None)
    return tuple(values)


def settings_of(sections: dict[str, type]) -> dict[str, Setting]:
    """The settings (fields declared with `setting`) of each section's dataclass, by name."""
    out: dict[str, Setting] = {}
    for section, cls in sections.items():
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            if "help" not in f.metadata:  # model, and the nested sections
                continue
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
            out[f.name] = Setting(f.name, section, hints[f.name], default, f.metadata["help"])
    return out


# Every engine setting, by its flat name: declared once, as a field above.
ENGINE_SETTINGS: dict[str, Setting] = settings_of(
    {"engine": EngineConfig, "cache": CacheConfig, "scheduler": SchedulerConfig}
)


def engine_arg_names() -> set[str]:
    """The flat engine-argument names shared by `LLM(...)` and `bench serve` flags."""
    return set(ENGINE_SETTINGS)
