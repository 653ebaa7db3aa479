"""One benchmark run from a `RunConfig`, in three steps the CLI calls in order: `build_plan`
(the schedule and prompts, before any server starts, so a bad file fails first), `connect`
(the backend for a target the CLI started or was given) and `measure` (telemetry, the load
under an event loop, requests.jsonl and timeline.csv, the summary). Starting and stopping the
bundled server, printing and writing the summary and report are the CLI's."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import json
import os
import signal
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from loadgen.arrivals import Arrivals, take_schedule
from loadgen.backends import Backend
from loadgen.config import RunConfig
from loadgen.endpoints import api_url, server_root
from loadgen.metrics import SLO, summarize, summarize_classes
from loadgen.mix import class_schedule, merge, warmup_requests
from loadgen.records import RecordWriter, RequestRecord
from loadgen.redact import redact_url
from loadgen.runner import LoadPlan, LoadRunner, ProbeFailed, RunOutcome, run_event_loop
from loadgen.sessions import Session, multi_turn_summary, sharegpt_sessions, synthetic_sessions
from loadgen.telemetry import Telemetry, spec_counts
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


@dataclass(frozen=True, slots=True)
class Target:
    """Where the load goes (an API root, or None: the bundled engine in this process) and
    what can be watched of it: a process (CPU, RSS) and a Prometheus /metrics page."""

    kind: str  # external | bundled | bundled-in-process | naive-in-process
    base_url: str | None = None
    pid: int | None = None
    metrics_url: str | None = None
    server: str | None = None  # in words, where the kind does not say it all

    @classmethod
    def external(cls, base_url: str) -> Target:
        """Any server: only its /metrics (vLLM serves it beside /v1), no process of ours."""
        return cls("external", base_url, None, _metrics_url(base_url))

    @classmethod
    def bundled(cls, base_url: str, pid: int | None) -> Target:
        return cls("bundled", base_url, pid, _metrics_url(base_url))

    @classmethod
    def in_process(cls) -> Target:
        return cls("bundled-in-process", None, os.getpid(), None)

    @classmethod
    def simulated(cls, server: str) -> Target:
        """The simulated engine (engine/sim): nothing real to watch."""
        return cls("simulated", None, None, None, server)

    @classmethod
    def naive(cls, batch: int) -> Target:
        """The naive baseline: transformers in this process (its CPU and RSS; no gauges)."""
        from loadgen.naive_backend import describe

        return cls("naive-in-process", None, os.getpid(), None, describe(batch))

    def describe(self) -> dict[str, Any]:
        """For config.json."""
        url = {"base_url": redact_url(self.base_url)} if self.base_url else {}
        out = {"kind": self.kind} | url
        return out | ({"server": self.server} if self.server else {})


def _metrics_url(base_url: str) -> str:
    """/metrics beside the API root (/v1), the root's query kept."""
    return api_url(server_root(base_url), "metrics")


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


def connect(
    cfg: RunConfig, target: Target, tokenizer: Any, local_peak: dict[str, Any] | None = None
) -> Backend:
    """The backend for a target: streaming HTTP, the bundled engine built from
    `cfg.engine` in this process, the naive transformers baseline (`cfg.naive_batch`), or the
    simulated engine (`local_peak`: this machine's measured peaks, for its roofline)."""
    from loadgen.backends import InProcessBackend, OpenAIBackend

    if target.kind == "simulated":
        from loadgen.sim_setup import sim_backend

        return sim_backend(cfg, tokenizer, local_peak)

    if target.kind == "naive-in-process":
        from loadgen.naive_backend import NaiveBackend

        assert cfg.model is not None and cfg.naive_batch is not None
        return NaiveBackend(
            cfg.model, cfg.naive_batch, cfg.endpoint, cfg.ignore_eos, cfg.sampling(), **cfg.engine
        )
    if target.base_url is None:
        assert cfg.model is not None
        return InProcessBackend.from_engine_args(
            cfg.model, cfg.endpoint, cfg.ignore_eos, cfg.sampling(), **cfg.engine
        )
    return OpenAIBackend(
        target.base_url,
        cfg.model or "",
        cfg.endpoint,
        cfg.api_key,
        cfg.timeout,
        max_connections=cfg.concurrency or 0,  # an open loop must never queue in the pool
        ignore_eos=cfg.ignore_eos,
        tokenizer=tokenizer,
        extra_body=cfg.extra_body,
        sampling=cfg.sampling(),
        headers=cfg.headers,
    )


# Called once the load is about to start, with what a live view shows; it may return a task
# (the view's) that is cancelled when the run ends.
OnStart = Callable[[LoadRunner, Telemetry], "asyncio.Task | None"]


def measure(
    cfg: RunConfig,
    built: BuiltPlan,
    backend: Backend,
    target: Target,
    out_dir: Path,
    on_start: OnStart | None = None,
) -> tuple[dict[str, Any], RunOutcome]:
    """Run the plan under its own event loop with telemetry sampling the target; writes
    requests.jsonl, timeline.csv (and steps.jsonl for an in-process engine); the summary."""
    clock = getattr(backend, "clock", None)  # simulated: a virtual clock
    engine = getattr(backend, "engine", None)
    engine = engine if clock is not None else getattr(engine, "engine", None)  # in process
    if engine is not None:
        engine.log_steps(out_dir / "steps.jsonl")
    telemetry = Telemetry(target.pid, target.metrics_url, cfg.telemetry_interval)
    spec_before = engine.spec_stats() if engine is not None else None
    if clock is None:  # a simulation has no device or process to watch (a GPU here is idle)
        telemetry.start()
    try:
        main = run_benchmark(cfg, backend, built, out_dir, on_start, telemetry)
        if clock is not None:
            from loadgen.virtual_loop import run_virtual

            summary, outcome = run_virtual(main, clock)
        else:
            summary, outcome = run_event_loop(main)
    finally:
        telemetry.stop()
        if engine is not None:
            engine.log_steps(None)  # closes steps.jsonl
    if clock is None:  # a simulation's timeline is its steps.jsonl
        telemetry.write_csv(out_dir / "timeline.csv", outcome.t0)
    summary["telemetry"] = telemetry.summary()
    _check_template_tokens(summary, built.info.get("template_tokens"))
    if engine is not None:  # in process: no /metrics, the engine's own counters
        summary["telemetry"] |= spec_counts(spec_before, engine.spec_stats())
    explain_multi_token_chunks(summary)
    draft_shares_by_request(summary, outcome.records)
    summary["clock_t0"] = outcome.t0  # perf_counter at t=0: steps.jsonl's "t" minus this
    return summary, outcome


def _check_template_tokens(summary: dict[str, Any], taken_off: int | None) -> None:
    """--input-len-after-template: the server's count against what was taken off the prompts
    (a template of its own, not the tokenizer's, shows here)."""
    added = summary.get("prompt_tokens_added")
    if taken_off is None or not added:
        return
    summary["warnings"] = [w for w in summary["warnings"] if not w.startswith("the server counted")]
    if abs(added["mean"] - taken_off) >= 0.5:
        summary["warnings"].append(
            f"--input-len-after-template took {taken_off} tokens off each prompt (the "
            f"tokenizer's chat template) but the server counted {added['mean']:.3g} added: its "
            "template is not the tokenizer's, and the prompts miss --input-len by the difference"
        )


def draft_shares_by_request(summary: dict[str, Any], records: list[RequestRecord]) -> None:
    """With speculative decoding, how each request's share of decodes given a draft spread
    (engine/sim/speculation.per_request_shares; at most 100 quantiles): what
    `--sim-draft-share` takes to simulate this run's spread of per-request speeds."""
    t = summary.get("telemetry") or {}
    rates, share = t.get("spec_acceptance_per_pos"), t.get("spec_draft_share")
    if not rates or (share is not None and share >= 1):  # a draft model: every decode drafts
        return
    from engine.sim.speculation import Acceptance, per_request_shares

    chunks = [r.chunk_tokens for r in records if r.ok and r.n == 1]
    shares = per_request_shares(chunks, Acceptance(per_pos=tuple(rates)), len(rates), share)
    if len(shares) > 100:
        shares = np.quantile(shares, (np.arange(100) + 0.5) / 100).round(4).tolist()
    if shares:
        t["spec_draft_share_by_request"] = sorted(shares)


def explain_multi_token_chunks(summary: dict[str, Any]) -> None:
    """Say why chunks carried several tokens when the server speculated."""
    t = summary.get("telemetry") or {}
    if not t.get("spec_drafts"):
        return
    why = (
        f"speculative decoding: {t['spec_mean_acceptance_length']:.2f} tokens per verified "
        f"draft, {(t['spec_acceptance_rate'] or 0):.0%} of draft tokens accepted"
    )
    warnings = summary.get("warnings") or []
    for i, w in enumerate(warnings):
        if w.startswith("some chunks carried more than one token"):
            warnings[i] = f"{w} (the server's {why})"


async def run_benchmark(
    cfg: RunConfig,
    backend: Backend,
    built: BuiltPlan,
    out_dir: Path,
    on_start: OnStart | None = None,
    telemetry: Telemetry | None = None,
) -> tuple[dict[str, Any], RunOutcome]:
    """Run the plan; Ctrl-C stops sending, cancels what is in flight and still summarizes
    every request that finished. A failed test request ends the run with an empty summary
    whose `stopped_early` and `test_request` say why."""
    # A simulation hands over each record's token times already as text (TimeTexts)
    writer = RecordWriter(out_dir / "requests.jsonl", getattr(backend, "time_texts", None))
    clock = getattr(backend, "clock", None)  # a simulated engine's virtual clock
    times = {"clock": clock.time} if clock is not None else {}
    if cfg.workers != 1 or cfg.ray_address:  # from worker processes (loadgen/split_runner.py)
        from loadgen.split_runner import split_runner

        runner: Any = split_runner(cfg, backend, built.plan, writer.write)
    else:
        runner = LoadRunner(backend, built.plan, writer.write, cfg.name, **times)
    loop = asyncio.get_running_loop()
    # the caller's handlers (raising outside the loop), put back when the load ends
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, runner.stop, sig)
    except (NotImplementedError, RuntimeError):  # not the main thread, or no signals here
        pass
    view = on_start(runner, telemetry or Telemetry()) if on_start is not None else None
    try:
        outcome = await runner.run()
    except ProbeFailed as e:  # nothing measured: still a summary (and report) saying why
        outcome = RunOutcome([], [], 0.0, False, runner.t0, str(e))
    finally:
        writer.close()
        if view is not None:
            view.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await view
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                loop.remove_signal_handler(sig)  # resets to the default: not the caller's
                if previous[sig] is not None:
                    signal.signal(sig, previous[sig])
    summary = summarize(
        outcome.records,
        outcome.elapsed_s,
        built.arrivals,
        SLO.parse(cfg.slo),
        cfg.max_p99_lag_ms / 1e3,
        {c.name: SLO.parse(c.slo) for c in cfg.classes},
    )
    if cfg.classes:
        slos = {c.name: SLO.parse(c.slo) for c in cfg.classes}
        summary["classes"] = summarize_classes(
            outcome.records, outcome.elapsed_s, built.class_arrivals, slos, cfg.max_p99_lag_ms / 1e3
        )
    if cfg.workers != 1 or cfg.ray_address:
        from loadgen.per_worker import judge_workers

        judge_workers(summary, outcome.records, cfg.closed_loop)
        runner.describe(summary)  # a dead worker; Ray workers' clock offsets
    summary["interrupted"] = outcome.interrupted
    summary["stop_signal"] = runner.stop_signal
    summary["stopped_in"] = runner.phase if outcome.interrupted else None
    summary["stopped_early"] = outcome.stopped_early
    summary["warmup_requests"] = len(outcome.warmup)
    if cfg.turns is not None:
        summary["multi_turn"] = multi_turn_summary(outcome.records)
    if runner.probe_record is not None:  # the server saw it too (its steps, its counters)
        summary["test_request"] = json.loads(runner.probe_record.to_json())
    return summary, outcome
