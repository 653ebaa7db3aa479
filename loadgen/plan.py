"""A run's plan, built before any server starts so that a bad file or setting fails first:
the whole arrival schedule and every prompt (or a closed loop's stream of them), the
warm-up requests and the test request."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

from loadgen.arrivals import Arrivals, take_schedule
from loadgen.config import RunConfig
from loadgen.load_plan import LoadPlan
from loadgen.mix import class_schedule, merge, warmup_requests
from loadgen.sessions import Session, sharegpt_sessions, synthetic_sessions
from loadgen.traces import read_trace
from loadgen.workload import (
    DEFAULT_INPUT_LEN,
    DEFAULT_OUTPUT_LEN,
    PromptBuilder,
    RequestSpec,
    ShareGPT,
    WorkloadConfig,
    chat_template_tokens,
    from_trace,
    read_sharegpt,
    sharegpt,
    synthetic,
)

T = TypeVar("T")


@dataclass(slots=True)
class BuiltPlan:
    plan: LoadPlan
    arrivals: Arrivals | None  # None: closed loop
    info: dict[str, Any]  # what was read (trace rows skipped, dataset size), for config.json
    notes: list[str] = field(default_factory=list)  # what to tell the user before the run
    class_arrivals: dict[str, Arrivals] = field(default_factory=dict)  # traffic classes


def build_plan(cfg: RunConfig, tokenizer: Any) -> BuiltPlan:
    builder = PromptBuilder(tokenizer)
    info: dict[str, Any] = {}
    notes: list[str] = []
    data: ShareGPT | None = None
    warmup_seed = cfg.seed + 1_000_003  # warm-up prompts never repeat measured ones
    if cfg.classes:
        return _class_plan(cfg, builder, warmup_seed)
    if cfg.arrival == "trace":
        assert cfg.trace is not None
        trace = read_trace(cfg.trace, cfg.trace_format, cfg.trace_model)
        info["trace"] = {
            "path": trace.path,
            "format": trace.format,
            "rows": len(trace.rows),
            "skipped_failed": trace.skipped_failed,
            "skipped_model": trace.skipped_model,
        }
        specs = from_trace(trace, builder, cfg.seed, cfg.output_len)
        stamps = tuple(row.timestamp_s for row in trace.rows)
        arrivals = Arrivals("trace", trace_offsets=stamps, time_scale=cfg.time_scale)
        offsets = take_schedule(arrivals.offsets(), cfg.num_requests or len(specs), cfg.duration)
        # The first rows' lengths with other tokens: warm-up must not prefill the cache with
        # the very prompts (and hash blocks) the measured requests then hit.
        warm_specs = from_trace(trace, builder, warmup_seed, cfg.output_len)
        warmup = warm_specs[: cfg.warmup]
        plan = LoadPlan(
            handed_out(specs),
            offsets,
            cfg.concurrency,
            warmup=warmup,
            probe=probe_of(warm_specs[0]),
        )
        return BuiltPlan(plan, arrivals, info)

    if cfg.dataset:
        kind, _, path = cfg.dataset.partition(":")
        if kind != "sharegpt" or not path:
            raise ValueError(f"dataset {cfg.dataset!r}: expected sharegpt:PATH")
        data = read_sharegpt(path, tokenizer, dialogues=cfg.turns is not None)
        info["dataset"] = data.as_dict()
        stream: Iterator[RequestSpec | Session] = sharegpt(data, cfg.seed, cfg.output_len)
        if cfg.turns is not None:
            stream = sharegpt_sessions(data, cfg.turns, cfg.think_time, cfg.seed, cfg.output_len)
        warm = sharegpt(data, warmup_seed, cfg.output_len)
    else:
        in_len, out_len = cfg.input_len or DEFAULT_INPUT_LEN, cfg.output_len or DEFAULT_OUTPUT_LEN
        added = chat_template_tokens(builder) if cfg.input_len_after_template else 0
        if added:  # what the template adds comes off each prompt: --input-len after it
            info["template_tokens"] = added
            notes.append(f"the chat template adds {added} tokens: taken off each prompt")
        wl = WorkloadConfig(
            in_len, out_len, cfg.shared_prefix_len, cfg.num_prefix_groups, cfg.seed, added
        )
        stream = synthetic(wl, builder)
        if cfg.turns is not None:  # each turn a fresh prompt of the input length, after the rest
            stream = synthetic_sessions(stream, cfg.turns, cfg.think_time, cfg.seed)
        warm = synthetic(dataclasses.replace(wl, seed=warmup_seed), builder)
    if cfg.n > 1:  # parallel sampling: n completions of every measured prompt
        stream = (dataclasses.replace(x, n=cfg.n) for x in stream)  # type: ignore[arg-type]
    # The streams are generators: pull a request now, so a bad file or setting fails here,
    # before any server starts, not in the middle of the run.
    stream = itertools.chain([next(stream)], stream)
    probe = probe_of(next(warm))  # single-turn, as the warm-up requests are
    warmup = list(itertools.islice(warm, cfg.warmup))
    if cfg.closed_loop:
        if data is not None:
            notes.append(data.describe(cfg.num_requests))
        total = None
        if cfg.turns is not None and cfg.num_requests is not None:  # conversations built now
            items = list(itertools.islice(stream, cfg.num_requests))
            total, stream = _requests_in(items), iter(items)
        plan = LoadPlan(
            stream,
            None,
            cfg.concurrency,
            cfg.num_requests,
            cfg.duration,
            warmup=warmup,
            probe=probe,
            total_requests=total,
        )
        return BuiltPlan(plan, None, info, notes)
    ramp = cfg.ramp()
    rate = cfg.rate if ramp is None else max(ramp.start, ramp.end)
    arrivals = Arrivals(cfg.arrival, rate, seed=cfg.seed, ramp=ramp, **cfg.arrival_params)
    offsets = take_schedule(arrivals.offsets(), cfg.num_requests, cfg.duration)
    specs = list(itertools.islice(stream, len(offsets)))  # all prompts built before t0
    if data is not None:
        notes.append(data.describe(len(offsets)))
    total = _requests_in(specs) if cfg.turns is not None else None
    plan = LoadPlan(
        handed_out(specs),
        offsets,
        cfg.concurrency,
        warmup=warmup,
        probe=probe,
        total_requests=total,
    )
    return BuiltPlan(plan, arrivals, info, notes)


def handed_out(items: list[T]) -> Iterator[T]:
    """The items in order, each let go of once taken: the plan does not hold every prompt to
    the end of the run (a simulated hour's 360,000 are ~1 GB)."""
    items.reverse()
    while items:
        yield items.pop()


def _class_plan(cfg: RunConfig, builder: PromptBuilder, warmup_seed: int) -> BuiltPlan:
    """Each class's own schedule and prompts, merged by time into one open-loop plan; the
    arrival check is made class by class (the merged gaps follow no one process)."""
    schedules = [class_schedule(c, cfg.seed, cfg.duration, builder) for c in cfg.classes]
    offsets, specs = merge(schedules)
    warm = warmup_requests(cfg.classes, warmup_seed, builder)
    warmup = list(itertools.islice(warm, cfg.warmup))
    probe = probe_of(warmup[0] if warmup else next(warm))  # the first class's (unmeasured)
    plan = LoadPlan(handed_out(specs), offsets, cfg.concurrency, warmup=warmup, probe=probe)
    info = {"classes": {s.cls.name: {"scheduled": len(s.offsets)} for s in schedules}}
    arrivals = {s.cls.name: s.arrivals for s in schedules}
    return BuiltPlan(plan, None, info, class_arrivals=arrivals)


def _requests_in(items: list[RequestSpec | Session]) -> int:
    return sum(len(x.turns) if isinstance(x, Session) else 1 for x in items)


def probe_of(spec: RequestSpec) -> RequestSpec:
    """The test request: a real prompt of the run's kind, a few tokens long."""
    return dataclasses.replace(spec, output_len=min(spec.output_len, 4))
