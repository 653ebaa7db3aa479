"""The weights an engine runs: loaded once per process and shared by its engines (a benchmark
or test that compares settings loads the model once), per tensor-parallel rank a shard of
them; and the model runner over them."""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch

from engine.config import EngineConfig
from engine.distributed.group import TPGroup
from engine.distributed.sharding import Shard, shard_model
from engine.kernel_pool import take_threads
from engine.model.kv_scales import calibrate_kv_scales, calibration_token_ids
from engine.model.loader import LoadedModel, load_model
from engine.ops.cpu_linear import packing_enabled
from engine.ops.fp8 import FP8
from engine.runner import ModelRunner

DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32, "fp8": FP8}


class ModelKey(NamedTuple):
    """What makes two engines' weights the same: they share one loaded model."""

    model: str
    dtype: torch.dtype
    device: torch.device
    seed: int
    quantization: str | None
    pack: bool  # CPU linears re-laid out (engine/ops/cpu_linear.py)
    tp_rank: int = 0  # tensor parallelism: this rank's shard of the weights
    tp_size: int = 1
    load_format: str = "auto"  # dummy: random weights of the model's shape

    @classmethod
    def of(cls, config: EngineConfig, device: torch.device, tp_rank: int = 0) -> ModelKey:
        """The weights of a config whose dtype is resolved."""
        dtype = DTYPES[config.dtype]
        pack = packing_enabled(dtype, device)
        return cls(config.model, dtype, device, config.seed, config.quantization, pack,
                   tp_rank, config.tensor_parallel_size, config.load_format)  # fmt: skip


@functools.lru_cache(maxsize=2)
def load_shared(key: ModelKey) -> LoadedModel:
    """Weights are read-only to the engine, so engines in one process share them: a benchmark
    or test that compares settings loads the model once."""
    loaded = load_model(key.model, key.dtype, key.device, key.seed, key.load_format)
    if key.tp_size > 1:  # before quantizing and packing: they work on the shard
        shard_model(loaded.model, Shard.plan(loaded.config, key.tp_rank, key.tp_size))
    if key.quantization == "fp8":
        loaded.model.quantize_fp8()
    if key.pack:  # fp8 is asked for to save memory: no packed copy of a tied LM head then
        loaded.model.pack_for_cpu(tied_head=key.quantization != "fp8")
    return loaded


@functools.lru_cache(maxsize=4)
def kv_scales(key: ModelKey) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Calibrated on the whole model (tensor-parallel ranks take their heads' scales)."""
    key = key._replace(tp_rank=0, tp_size=1)
    loaded = load_shared(key)
    ids = calibration_token_ids(loaded.tokenizer, loaded.config.vocab_size)
    return calibrate_kv_scales(loaded.model, loaded.config, ids, block_size=16)


def make_runner(
    config: EngineConfig,
    loaded: LoadedModel,
    kv_scales: list[tuple[torch.Tensor, torch.Tensor]] | None,
    tp: TPGroup | None = None,
) -> ModelRunner:
    """The runner of a resolved config over a loaded model; under tensor parallelism, of
    this rank's shard (its KV heads and their fp8 scales; the all-reduces attached)."""
    cfg = loaded.config
    if tp is not None:
        shard = Shard.plan(cfg, tp.rank, tp.size)
        cfg = shard.local_config(cfg)
        heads = slice(shard.kv_heads.start, shard.kv_heads.stop)
        if kv_scales is not None:
            kv_scales = [(k[heads], v[heads]) for k, v in kv_scales]
        loaded.model.tp = tp
        for layer in loaded.model.layers:
            layer.self_attn.reduce = layer.mlp.reduce = tp.all_reduce
    assert config.cache.num_kv_blocks is not None, "resolve the config first"
    kv_dtype = DTYPES[config.cache.kv_cache_dtype]
    if loaded.model.embed_tokens.weight.device.type == "cpu":  # before graphs compile
        take_threads(loaded.model, kv_dtype, cfg.head_dim)
    return ModelRunner(
        loaded.model,
        cfg,
        config.cache.num_kv_blocks,
        config.cache.block_size,
        config.seed,
        kv_dtype,
        kv_scales,
        compile_decode=not config.enforce_eager,
        attention_backend=config.attention_backend,
        tp=tp,
    )


def build_tp_rank(
    config: EngineConfig,
    device: torch.device,
    tp: TPGroup,
    kv_scales: list[tuple[torch.Tensor, torch.Tensor]] | None,
) -> ModelRunner:
    """A tensor-parallel worker's runner (engine/distributed/worker.py), from the driver's
    resolved config."""
    torch.manual_seed(config.seed)
    loaded = load_shared(ModelKey.of(config, device, tp.rank))
    assert config.max_model_len is not None
    loaded.model.prepare(config.max_model_len)
    return make_runner(config, loaded, kv_scales, tp)
