"""servebench's bundled inference engine: paged KV cache, continuous batching, chunked prefill."""

from engine.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from engine.engine import LLM, LLMEngine
from engine.request import CompletionOutput, RequestOutput, SamplingParams

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
