"""What a `LoadRunner` (runner.py) is given: the requests, when each is sent (an open
loop's offsets) or how many at once (a closed loop), the warm-up and the test request.
Built from a run's config by plan.py (by hand in tests and benchmarks); it refuses a closed
loop without a width or a limit."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from loadgen.sessions import Session
from loadgen.workload import RequestSpec


@dataclass(slots=True)
class LoadPlan:
    specs: Iterator[RequestSpec | Session]  # a Session: a conversation, turn after turn
    offsets: list[float] | None  # open loop: send offsets in seconds; None: closed loop
    concurrency: int | None = None  # closed loop's width, or a cap on the open loop
    num_requests: int | None = None  # closed loop's limits (an open loop's are in offsets)
    duration_s: float | None = None
    warmup: list[RequestSpec] = field(default_factory=list)
    probe: RequestSpec | None = None  # one test request before anything else (as vLLM's bench)
    total_requests: int | None = None  # when the requests are not one per scheduled item

    def __post_init__(self) -> None:
        if self.offsets is None and not self.concurrency:
            raise ValueError("a closed loop needs a concurrency")
        if self.concurrency is not None and self.concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {self.concurrency}")
        if self.offsets is None and self.num_requests is None and self.duration_s is None:
            raise ValueError("a closed loop needs a number of requests or a duration")

    @property
    def total(self) -> int | None:
        if self.total_requests is not None:
            return self.total_requests
        return len(self.offsets) if self.offsets is not None else self.num_requests
