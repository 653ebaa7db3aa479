"""The HTTP layer's limits and the API key's variable, apart from the server so that the CLI
can take its defaults without importing torch."""

from __future__ import annotations

from dataclasses import dataclass

API_KEY_ENV = "SERVEBENCH_API_KEY"  # as vLLM reads VLLM_API_KEY


@dataclass
class ServerLimits:
    """What one client may hold (each a `bench serve` flag)."""

    max_body_bytes: int = 16 * 2**20  # larger: 413, by Content-Length before reading any
    body_timeout_s: float = 30.0  # the whole body must arrive within this: else 408
    max_body_reads: int = 128  # bodies being received at once; beyond it: 503 at once

    def __post_init__(self) -> None:
        if self.max_body_bytes < 1 or self.max_body_reads < 1 or not self.body_timeout_s > 0:
            raise ValueError(f"server limits must be positive, got {self}")
