"""A mix of traffic classes as one open-loop schedule: each class gets its own seeded arrival
process and prompts, and the schedules are merged by time. The runner sleeps to absolute
offsets, so the merged plan sends every class on its own process; each request carries its
class's name, `n` and priority."""

from __future__ import annotations

import dataclasses
import hashlib
import heapq
import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from loadgen.arrivals import Arrivals, take_schedule
from loadgen.traffic import TrafficClass
from loadgen.workload import PromptBuilder, RequestSpec, WorkloadConfig, synthetic


@dataclass(slots=True)
class ClassSchedule:
    cls: TrafficClass
    arrivals: Arrivals
    offsets: list[float]
    specs: list[RequestSpec]


def class_seed(seed: int, name: str, stream: int) -> int:
    """A class's own seed for one random stream (0: arrivals, 1: prompts), from its name:
    adding, removing or reordering the other classes leaves its schedule as it was."""
    key = int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "little")
    return int(np.random.SeedSequence([seed, key, stream]).generate_state(1)[0])


def class_requests(cls: TrafficClass, seed: int, builder: PromptBuilder) -> Iterator[RequestSpec]:
    """Endless requests of one class (prompts from `seed`), tagged with its name, n and
    priority."""
    wl = WorkloadConfig(
        cls.input_len, cls.output_len, cls.shared_prefix_len, cls.num_prefix_groups, seed
    )
    for spec in synthetic(wl, builder):
        yield dataclasses.replace(spec, cls=cls.name, n=cls.n, priority=cls.priority)


def class_schedule(
    cls: TrafficClass, seed: int, duration_s: float | None, builder: PromptBuilder
) -> ClassSchedule:
    """A class's arrivals up to its own request count and/or the run's duration, and its
    prompts, all built before the run starts."""
    arrivals = Arrivals(
        cls.arrival, cls.rate, seed=class_seed(seed, cls.name, 0), **cls.arrival_params
    )
    offsets = take_schedule(arrivals.offsets(), cls.num_requests, duration_s)
    specs = list(
        itertools.islice(class_requests(cls, class_seed(seed, cls.name, 1), builder), len(offsets))
    )
    return ClassSchedule(cls, arrivals, offsets, specs)


def merge(schedules: Sequence[ClassSchedule]) -> tuple[list[float], list[RequestSpec]]:
    """One schedule, by time; at equal times the class listed first goes first."""
    tagged = ([(t, k, i) for i, t in enumerate(s.offsets)] for k, s in enumerate(schedules))
    order = list(heapq.merge(*tagged))
    return [t for t, _, _ in order], [schedules[k].specs[i] for _, k, i in order]


def warmup_requests(
    classes: Sequence[TrafficClass], seed: int, builder: PromptBuilder
) -> Iterator[RequestSpec]:
    """Warm-up (and test) requests taken from the classes in turn, with prompts of their own
    seed: every class's shape is warmed, and none of the measured prompts is."""
    streams = [class_requests(c, class_seed(seed, c.name, 1), builder) for c in classes]
    for k in itertools.cycle(range(len(streams))):
        yield next(streams[k])
