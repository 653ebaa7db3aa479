"""servebench's bundled inference engine: paged KV cache, continuous batching, chunked prefill.

The engine's names are imported on first use (PEP 562): `engine.config` and
`engine.model.sources` serve `bench run --base-url`, which must not pay for importing torch."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from engine.cpu_alloc import keep_freed_memory_in_heap

keep_freed_memory_in_heap()  # before torch is imported (by any submodule): see cpu_alloc.py
from engine import omp_wait  # noqa: E402, F401 (OpenMP's wait policy, also before torch)
from engine.inductor_cache import separate_cache_per_capability  # noqa: E402

separate_cache_per_capability()  # before inductor compiles: see inductor_cache.py

if TYPE_CHECKING:
    from engine.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
    from engine.core.request import CompletionOutput, RequestOutput, SamplingParams
    from engine.engine import LLMEngine
    from engine.llm import LLM

_LAZY = {
    "CacheConfig": "engine.config",
    "EngineConfig": "engine.config",
    "ModelConfig": "engine.config",
    "SchedulerConfig": "engine.config",
    "CompletionOutput": "engine.core.request",
    "RequestOutput": "engine.core.request",
    "SamplingParams": "engine.core.request",
    "LLM": "engine.llm",
    "LLMEngine": "engine.engine",
}
__all__ = [
    "LLM",
    "CacheConfig",
    "CompletionOutput",
    "EngineConfig",
    "LLMEngine",
    "ModelConfig",
    "RequestOutput",
    "SamplingParams",
    "SchedulerConfig",
]


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'engine' has no attribute {name!r}")
    value = getattr(importlib.import_module(_LAZY[name]), name)
    globals()[name] = value  # later look-ups skip this function
    return value
