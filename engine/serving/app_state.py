"""What the server's handlers share: the async engine and the server's own state
(counters, histograms, the config labels), under their keys on the aiohttp app."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from engine.serving.async_engine import AsyncLLMEngine
from engine.serving.metrics import Histogram

ENGINE_KEY = web.AppKey("engine", AsyncLLMEngine)
STATE_KEY = web.AppKey("state", "ServerState")


@dataclass
class ServerState:
    model_name: str
    max_queue: int
    started_at: float
    config: dict[str, Any]
    ttft_s: Histogram
    requests_total: int = 0
    rejected_total: int = 0
    queue_time_s: Histogram = field(default_factory=Histogram)  # observed by the engine thread
