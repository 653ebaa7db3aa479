"""Every metric a run measures, declared once: its summary key, unit, which way is better and
what it means. summary.json's definitions, summary.csv's column names, sweep.csv's columns,
the gate's directions, the tables' labels and the docs' metric reference are read from here,
so a metric added here reaches all of them (a metric listed by hand in five places was
missing from some: peak_output_throughput was printed but refused by `bench gate`).

Torch-free, like the rest of the load generator. Readers look entries up when called (not at
import), so a test can add a metric to `METRICS` and see it everywhere."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from loadgen.records import RequestRecord

# distribution: an object of STATS in seconds; scalar: one number (or bool) in summary.json;
# derived: a number sweep.csv computes from a run's summary (not in summary.json); detail: an
# object of named fields in summary.json, described but neither gated nor kept by sweeps;
# telemetry: a number of the server's /metrics over the run (summary.json's telemetry.NAME),
# present only where the server exports it.
Kind = Literal["distribution", "scalar", "derived", "detail", "telemetry"]
Better = Literal["higher", "lower"]
# summary.csv names a column by its unit where the key does not say it (`_s` keys do).
UNIT_SUFFIX = {"req/s": "req_per_s", "tok/s": "tok_per_s"}


@dataclass(frozen=True, slots=True)
class Metric:
    name: str  # the summary.json key; sweep.csv and the gate use it too
    unit: str  # "s", "req/s", "tok/s", "requests", "tokens", "fraction", "bool"
    better: Better | None  # the direction `bench gate` judges; None: not gated
    definition: str  # one line: what is counted, from when to when
    kind: Kind = "scalar"
    label: str = ""  # what tables print (distributions)
    # its key under summary.json's `definitions`, where not its name (kept as summaries had it)
    short: str = ""
    # computed by summarize() from the finished requests and the run's duration (s), for a
    # metric that needs nothing else; None: summarize() computes it with the others
    compute: Callable[[Sequence[RequestRecord], float], Any] | None = None

    @property
    def column(self) -> str:
        """Its summary.csv column: the unit in the name where the key leaves it out."""
        suffix = UNIT_SUFFIX.get(self.unit)
        return f"{self.name}_{suffix}" if suffix else self.name

    @property
    def sign(self) -> int:
        """+1 when higher is better, -1 when lower is, 0 when neither."""
        return {"higher": 1, "lower": -1, None: 0}[self.better]


def _dist(name: str, label: str, definition: str) -> Metric:
    short = name.removesuffix("_s")
    return Metric(name, "s", "lower", definition, "distribution", label, short)


METRICS: dict[str, Metric] = {
    m.name: m
    for m in (
        _dist("ttft_s", "TTFT", "first chunk carrying output - send"),
        _dist(
            "itl_s",
            "ITL",
            "every gap between successive output chunks of one sequence (with n > 1: of one "
            "choice), pooled over requests (vLLM)",
        ),
        _dist("itl_per_token_s", "ITL per token", "each gap spread evenly over its chunk's tokens"),
        _dist(
            "tpot_s",
            "TPOT",
            "(e2e - ttft) / (output_tokens / n - 1) per request (n: completions asked for); "
            "the first token excluded (vLLM)",
        ),
        _dist("e2e_s", "E2E latency", "last chunk or end of stream - send"),
        _dist(
            "queue_s",
            "Queue (cap wait)",
            "wait for a free slot under a concurrency cap (not in ttft or e2e)",
        ),
        _dist(
            "ttft_with_queue_s",
            "TTFT incl. queue",
            "ttft + queue: what a user behind the cap would see",
        ),
        _dist("e2e_with_queue_s", "E2E incl. queue", "e2e + queue"),
        _dist(
            "schedule_lag_s",
            "Schedule lag",
            "send - scheduled - queue: how late the client itself was",
        ),
        Metric(
            "goodput",
            "req/s",
            "higher",
            "completed requests per second that met every SLO (DistServe), TTFT and E2E "
            "judged with the queue wait included",
        ),
        Metric("request_throughput", "req/s", "higher", "completed requests / duration"),
        Metric(
            "output_throughput",
            "tok/s",
            "higher",
            "output tokens of the completed requests / duration",
        ),
        Metric(
            "total_token_throughput",
            "tok/s",
            "higher",
            "(prompt + output) tokens of the completed requests / duration",
        ),
        Metric(
            "completed",
            "requests",
            "higher",
            "requests that ended with a full answer (warm-up requests not counted)",
        ),
        Metric(
            "failed",
            "requests",
            "lower",
            "requests that ended in an error (HTTP status, timeout, broken or aborted stream)",
        ),
        Metric("cancelled", "requests", "lower", "requests in flight when the run was interrupted"),
        Metric(
            "total_input_tokens",
            "tokens",
            None,
            "prompt tokens of the completed requests (the server's usage, else our tokenizer)",
        ),
        Metric(
            "total_cached_tokens",
            "tokens",
            "higher",
            "of those, served from the server's prefix cache (its usage's "
            "prompt_tokens_details.cached_tokens; null where it does not report them)",
        ),
        Metric("total_output_tokens", "tokens", None, "output tokens of the completed requests"),
        Metric(
            "max_p99_lag_s",
            "s",
            None,
            "the p99 schedule lag above which a run is INVALID (--max-p99-lag-ms)",
        ),
        Metric(
            "valid",
            "bool",
            None,
            "false when the p99 schedule lag exceeded max_p99_lag_s: the load offered was not "
            "the load asked for",
        ),
        Metric(
            "duration_s",
            "s",
            "lower",
            "first scheduled send to the end of the last request",
            short="duration",
        ),
        Metric(
            "peak_output_throughput",
            "tok/s",
            "higher",
            "most output tokens stamped (by their chunk's time) in one 1-s window counted from "
            "the first send (vLLM's max_output_tokens_per_s; vLLM counts a chunk as one token)",
        ),
        Metric(
            "peak_concurrent_requests",
            "requests",
            None,
            "most completed requests in flight at once, over [send, end) (vLLM's "
            "max_concurrent_requests: failed requests not counted)",
        ),
        Metric(
            "ttft_growth",
            "s",
            None,
            "median ttft_with_queue of the requests that arrived in the first and in the last "
            "quarter of an open loop's arrival span; it grew when the last is over twice the "
            "first and 50 ms more (a queue building up through the run)",
            "detail",
        ),
        Metric(
            "slo_attainment",
            "fraction",
            "higher",
            "requests that met every SLO / requests sent (a failed one is a miss)",
            "derived",
        ),
        Metric(
            "prompt_tokens_computed",
            "tokens",
            "lower",
            "total_input_tokens - total_cached_tokens: the prompt tokens the server computed",
            "derived",
        ),
        Metric(
            "telemetry.mean_engine_running",
            "requests",
            "higher",
            "requests the engine ran at once, averaged over the telemetry samples",
            "telemetry",
        ),
        Metric(
            "telemetry.preemptions",
            "requests",
            "lower",
            "requests the engine preempted (its KV cache freed) during the run",
            "telemetry",
        ),
        Metric(
            "telemetry.prefix_cache_hit_rate",
            "fraction",
            "higher",
            "prompt tokens the engine's prefix cache served / prompt tokens it looked up",
            "telemetry",
        ),
        Metric(
            "telemetry.peak_engine_kv_blocks_used",
            "blocks",
            "lower",
            "most KV-cache blocks in use at a telemetry sample",
            "telemetry",
        ),
        Metric(
            "telemetry.spec_acceptance_rate",
            "fraction",
            "higher",
            "speculative decoding: accepted draft tokens / draft tokens (vLLM)",
            "telemetry",
        ),
        Metric(
            "telemetry.spec_mean_acceptance_length",
            "tokens",
            "higher",
            "speculative decoding: tokens a verified draft yields, 1 + accepted / drafts (vLLM)",
            "telemetry",
        ),
    )
}
# What a summary holds beside the metrics: the run's context, not numbers to compare.
NOT_METRICS = frozenset(
    {
        "slo",
        "definitions",
        "tokens_counted_by",
        "failure_reasons",
        "warnings",
        "prompt_tokens_added",
        "arrival_check",
    }
)


def metric(name: str) -> Metric | None:
    return METRICS.get(name)


def of_kind(*kinds: Kind) -> list[Metric]:
    return [m for m in METRICS.values() if m.kind in kinds]


def distributions() -> dict[str, str]:
    """Every latency distribution a summary can hold, with the label tables print."""
    return {m.name: m.label for m in of_kind("distribution")}


def definitions() -> dict[str, str]:
    """What summary.json stores under `definitions`: what each of its metrics meant."""
    return {(m.short or m.name): m.definition for m in of_kind("distribution", "scalar", "detail")}


def computed(ok: Sequence[RequestRecord], duration_s: float) -> dict[str, Any]:
    """The metrics that declare their own computation, of the finished requests."""
    return {m.name: m.compute(ok, duration_s) for m in METRICS.values() if m.compute is not None}
