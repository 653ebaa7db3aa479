"""One benchmark run from a `RunConfig`, in three steps the CLI calls in order: `build_plan`
(loadgen/plan.py: the schedule and prompts, before any server starts, so a bad file fails
first), `connect` (the backend for a target the CLI started or was given) and `measure`
(telemetry, the load under an event loop, requests.jsonl and timeline.csv, the summary).
Starting and stopping the bundled server, printing and writing the summary and report are
the CLI's."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from loadgen.backends import Backend
from loadgen.config import RunConfig
from loadgen.endpoints import api_url, server_root
from loadgen.event_loop import run_event_loop
from loadgen.load_plan import LoadPlan
from loadgen.machine_cpu import steal_warning
from loadgen.metrics import SLO, summarize, summarize_classes
from loadgen.plan import BuiltPlan
from loadgen.records import RecordWriter, RequestRecord
from loadgen.redact import redact_url
from loadgen.runner import LoadRunner, ProbeFailed, RunOutcome
from loadgen.sessions import multi_turn_summary
from loadgen.telemetry import Telemetry, spec_counts


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


def connect(
    cfg: RunConfig, target: Target, tokenizer: Any, local_peak: dict[str, Any] | None = None
) -> Backend:
    """The backend for a target: streaming HTTP, the bundled engine built from
    `cfg.engine` in this process, the naive transformers baseline (`cfg.naive_batch`), or the
    simulated engine (`local_peak`: this machine's measured peaks, for its roofline)."""
    from loadgen.backends import OpenAIBackend
    from loadgen.in_process_backend import InProcessBackend

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
    if steal := steal_warning(summary["telemetry"]):
        summary["warnings"].append(steal)
    _check_template_tokens(summary, built.info.get("template_tokens"))
    if engine is not None:  # in process: no /metrics, the engine's own counters
        summary["telemetry"] |= spec_counts(spec_before, engine.spec_stats())
    explain_multi_token_chunks(summary)
    draft_shares_by_request(summary, outcome.records)
    summary["clock_t0"] = outcome.t0  # perf_counter at t=0: steps.jsonl's "t" minus this
    return summary, outcome


def _split_runner(
    cfg: RunConfig,
    backend: Backend,
    plan: LoadPlan,
    on_record: Callable[[RequestRecord], None] | None,
) -> Any:
    """The runner for --workers N: local processes, or Ray actors with --ray-address (chosen
    here: ray_runner builds on split_runner, which must not import it back)."""
    if cfg.ray_address:
        from loadgen.ray_runner import RaySplitRunner

        return RaySplitRunner(
            backend, plan, cfg.workers, on_record, cfg.name, address=cfg.ray_address
        )
    from loadgen.split_runner import SplitRunner

    return SplitRunner(backend, plan, cfg.workers, on_record, cfg.name)


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
        runner: Any = _split_runner(cfg, backend, built.plan, writer.write)
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
