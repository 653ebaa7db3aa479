"""servebench's bundled inference engine: paged KV cache, continuous batching, chunked prefill."""

# isort: off
from engine.cpu_alloc import keep_freed_memory_in_heap

keep_freed_memory_in_heap()  # before torch is imported below: see cpu_alloc.py
# isort: on
from engine.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig  # noqa: E402
from engine.core.request import CompletionOutput, RequestOutput, SamplingParams  # noqa: E402
from engine.engine import LLM, LLMEngine  # noqa: E402

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
