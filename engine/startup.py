"""A server's start-up, phase by phase: a first start builds kernels and compiles for
minutes, and a newcomer who sees only silence thinks it hung. Each phase is logged as it
begins and timed as it ends (logger "engine.startup"); `bench serve` prints the line."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

logger = logging.getLogger(__name__)


@dataclass
class Phases:
    times: dict[str, float] = field(default_factory=dict)  # phase -> seconds, in order

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        logger.info("%s ...", name)
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.times[name] = time.perf_counter() - t0
            logger.info("%s: %.1f s", name, self.times[name])

    def line(self) -> str:
        parts = [f"{name} {s:.1f} s" for name, s in self.times.items()]
        return f"start-up: {' · '.join(parts)} · ready in {sum(self.times.values()):.1f} s"
