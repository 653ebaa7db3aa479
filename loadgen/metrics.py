"""Request records -> the run's summary: latency distributions, throughput, goodput, and the
evidence that the client kept to its schedule.

Peers disagree on names (vLLM's TPOT excludes the first token, guidellm's includes it, AIPerf
calls vLLM's TPOT "ITL"), so every summary stores the definitions it used."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from loadgen.arrivals import Arrivals, ks_pvalue, ks_statistic, ks_two_sample
from loadgen.metric_registry import computed, definitions, distributions
from loadgen.records import RequestRecord, TokenTimes

# What each metric meant and each distribution's table label, as the registry declares them
# (at import; code that must see metrics added later calls the registry's functions).
DEFINITIONS = definitions()
PERCENTILES = (50, 90, 95, 99)
STATS = ("mean", *(f"p{p}" for p in PERCENTILES), "max")  # of every distribution
DISTRIBUTIONS = distributions()
DEFAULT_MAX_P99_LAG_S = 0.010


def distribution(values: Sequence[float]) -> dict[str, float | None]:
    """mean, p50, p90, p95, p99, max (linear interpolation, as numpy and vLLM) and count."""
    if len(values) == 0:
        return dict.fromkeys(STATS) | {"count": 0}
    a = np.asarray(values, dtype=np.float64)
    pct = np.percentile(a, PERCENTILES)
    out: dict[str, Any] = {"mean": float(a.mean())}
    out |= {f"p{p}": float(v) for p, v in zip(PERCENTILES, pct, strict=True)}
    return out | {"max": float(a.max()), "count": len(a)}


@dataclass(frozen=True, slots=True)
class SLO:
    """Per-request service-level objectives in seconds; None: not constrained."""

    ttft: float | None = None
    tpot: float | None = None
    e2e: float | None = None

    @classmethod
    def parse(cls, text: str | None) -> SLO:
        """`ttft=0.5,tpot=0.05,e2e=10` (seconds)."""
        if not text:
            return cls()
        values: dict[str, float] = {}
        for part in text.split(","):
            key, _, value = part.partition("=")
            key = key.strip()
            if key not in ("ttft", "tpot", "e2e"):
                raise ValueError(f"SLO {part!r}: expected ttft=S, tpot=S or e2e=S (seconds)")
            try:
                values[key] = float(value)
            except ValueError:
                raise ValueError(f"SLO {part!r}: {value!r} is not a number of seconds") from None
            if not values[key] > 0:
                raise ValueError(f"SLO {part!r}: must be > 0")
        return cls(**values)

    def as_dict(self) -> dict[str, float]:
        return {k: v for k, v in (("ttft", self.ttft), ("tpot", self.tpot), ("e2e", self.e2e)) if v}

    def met(self, ttft: float, tpot: float | None, e2e: float) -> bool:
        one = self.met_all(
            np.array([ttft]), np.array([np.nan if tpot is None else tpot]), np.array([e2e])
        )
        return bool(one[0])

    def met_all(self, ttft: np.ndarray, tpot: np.ndarray, e2e: np.ndarray) -> np.ndarray:
        """`met` of many requests at once; tpot NaN where a request has none."""
        ok = np.ones(len(ttft), dtype=bool)
        if self.ttft is not None:
            ok &= ttft <= self.ttft
        if self.tpot is not None:
            ok &= np.isnan(tpot) | (tpot <= self.tpot)
        if self.e2e is not None:
            ok &= e2e <= self.e2e
        return ok


@dataclass(frozen=True, slots=True)
class Latencies:
    """Each finished request's latencies (s, in the requests' order): computed here once, for
    the summary, the report's CDFs and vLLM's JSON alike."""

    send: np.ndarray
    queue: np.ndarray
    ttft: np.ndarray
    e2e: np.ndarray
    tpot_or_nan: np.ndarray  # NaN where a sequence got one token (no decode to time)
    decoded: np.ndarray  # bool: more than one token a sequence

    @classmethod
    def of(cls, ok: Sequence[RequestRecord]) -> Latencies:
        n = len(ok)
        send, first, end, queue = (
            np.fromiter((getattr(r, name) for r in ok), np.float64, n)
            for name in ("send_s", "first_chunk_s", "end_s", "queue_s")
        )
        assert not np.isnan(send).any() and not np.isnan(first).any() and not np.isnan(end).any()
        ttft, e2e = first - send, end - send
        # per sequence: n completions decode side by side, each its own tokens
        per_seq = np.fromiter((r.tokens_per_sequence for r in ok), np.float64, n)
        decoded = per_seq > 1
        tpot_or_nan = np.full(n, np.nan)
        tpot_or_nan[decoded] = (e2e[decoded] - ttft[decoded]) / (per_seq[decoded] - 1)
        return cls(send, queue, ttft, e2e, tpot_or_nan, decoded)

    @property
    def tpot(self) -> np.ndarray:
        """TPOT of the requests that decoded (vLLM's: the first token excluded)."""
        return self.tpot_or_nan[self.decoded]


FAILURE_REASONS = 10  # the most common errors summary.json keeps, with their counts


def summarize(
    records: Sequence[RequestRecord],
    duration_s: float,
    arrivals: Arrivals | None = None,
    slo: SLO | None = None,
    max_p99_lag_s: float = DEFAULT_MAX_P99_LAG_S,
    class_slos: Mapping[str, SLO] | None = None,
) -> dict[str, Any]:
    """The summary of the measured (non-warm-up) records. `arrivals` is the open-loop process
    the schedule came from (None for a closed loop); a request of a traffic class is judged
    by its class's SLO (`class_slos`), others by `slo`."""
    slo = slo or SLO()
    class_slos = class_slos or {}
    measured = [r for r in records if not r.warmup]
    ok = [r for r in measured if r.ok]
    n = len(ok)
    lat = Latencies.of(ok)
    send, queue, ttft, e2e, tpot_or_nan = lat.send, lat.queue, lat.ttft, lat.e2e, lat.tpot_or_nan
    tpot = lat.tpot
    chunks = TokenTimes.of(ok)
    itl = chunks.gaps(ok)
    multi = chunks.tokens is not None and bool((chunks.tokens > 1).any())  # several a chunk
    itl_tok: list[float] = []
    if multi:
        for r in ok:
            for gap, k in r.gaps():
                itl_tok.extend([gap / k] * k)
    # a user behind a cap sees TTFT and E2E with the queue wait
    ttft_queue, e2e_queue = ttft + queue, e2e + queue
    met = slo.met_all(ttft_queue, tpot_or_nan, e2e_queue)
    for name, class_slo in class_slos.items():
        mine = np.fromiter((r.cls == name for r in ok), bool, n)
        met[mine] = class_slo.met_all(ttft_queue, tpot_or_nan, e2e_queue)[mine]
    good = int(met.sum())
    lags = [lag for r in measured if (lag := r.schedule_lag_s) is not None]
    out_tokens = sum(r.output_tokens for r in ok)
    in_tokens = sum(r.prompt_tokens or 0 for r in ok)
    duration = max(duration_s, 1e-9)
    statuses = Counter(r.status for r in measured)
    summary: dict[str, Any] = {
        "ttft_s": distribution(ttft),
        "itl_s": distribution(itl),
        "tpot_s": distribution(tpot),
        "e2e_s": distribution(e2e),
        "queue_s": distribution(queue),
        "ttft_with_queue_s": distribution(ttft_queue),
        "e2e_with_queue_s": distribution(e2e_queue),
        "schedule_lag_s": distribution(lags),
        "request_throughput": len(ok) / duration,
        "output_throughput": out_tokens / duration,
        "total_token_throughput": (in_tokens + out_tokens) / duration,
        "peak_output_throughput": peak_output_throughput(ok, chunks),
        "peak_concurrent_requests": peak_concurrency(ok),
        "goodput": good / duration if _any_slo(slo, class_slos) else None,
        "slo": slo.as_dict(),
        "completed": len(ok),
        "failed": statuses["error"],
        "cancelled": statuses["cancelled"],
        "duration_s": duration_s,
        "total_input_tokens": in_tokens,
        # Prompt tokens the server's prefix cache served, when its usage says (None: silent)
        "total_cached_tokens": _cached(ok),
        "total_output_tokens": out_tokens,
        "tokens_counted_by": dict(Counter(r.output_tokens_source for r in ok)),
        "definitions": definitions(),
    }
    summary |= computed(ok, duration_s)  # metrics that declare their own computation
    warnings: list[str] = []
    if multi:
        summary["itl_per_token_s"] = distribution(itl_tok)
        warnings.append(
            "some chunks carried more than one token: itl_s is per chunk; itl_per_token_s "
            "spreads each gap over its tokens"
        )
    zero = int(np.count_nonzero(itl == 0))
    if len(itl) and zero / len(itl) > 0.01:
        warnings.append(
            f"{zero / len(itl):.0%} of ITL gaps are 0: chunks arrived together in one network "
            "read (the server batched them, or the client fell behind reading)"
        )
    added = [r.prompt_tokens_added for r in ok if r.prompt_tokens_added is not None]
    if added:
        summary["prompt_tokens_added"] = {
            "mean": float(np.mean(added)),
            "min": min(added),
            "max": max(added),
            "total": sum(added),
        }
        if (mean_added := float(np.mean(added))) >= 1:
            asked = float(np.mean([r.input_len for r in ok if r.prompt_tokens_added is not None]))
            warnings.append(
                f"the server counted {mean_added:.3g} more prompt tokens a request than were "
                f"asked ({asked:.3g} asked, {asked + mean_added:.3g} counted; min "
                f"{min(added)}, max {max(added)} added): its chat template (a system prompt, "
                "role markers) or a BOS. Input tokens and throughput count them, and a "
                "template's system prompt is the same in every request (the prefix cache "
                "serves it). --input-len sets the length before templating: to target N "
                f"tokens after it, give --input-len N-{round(mean_added)}, or "
                "--input-len-after-template"
            )
    short = sum(r.output_tokens < r.output_len for r in ok)
    if short:
        warnings.append(
            f"{short} of {len(ok)} requests got fewer output tokens than asked (stopped at EOS? "
            "the server may not support ignore_eos)"
        )
    if statuses["error"]:
        first = next(r for r in measured if r.status == "error")
        warnings.append(f"{statuses['error']} requests failed; the first: {first.error}")
    # what went wrong, most common first: a run where nothing succeeded has nothing else
    reasons = Counter(r.error or "unknown" for r in measured if r.status == "error")
    summary["failure_reasons"] = dict(reasons.most_common(FAILURE_REASONS))
    p99_lag = summary["schedule_lag_s"]["p99"]
    summary["max_p99_lag_s"] = max_p99_lag_s
    summary["valid"] = p99_lag is None or p99_lag <= max_p99_lag_s
    if not summary["valid"]:
        warnings.append(
            f"the client fell behind its schedule: p99 lag {p99_lag * 1e3:.1f} ms > "
            f"{max_p99_lag_s * 1e3:.0f} ms; the load offered was not the load asked for"
        )
    if arrivals is not None:
        # The schedule gives first turns only; a conversation's later turns follow its replies.
        summary["arrival_check"] = arrival_check([r for r in measured if not r.turn], arrivals)
        turn0 = np.fromiter((not r.turn for r in ok), bool, n)  # scheduled: first turns
        growth = ttft_growth((send - queue)[turn0], ttft_queue[turn0])
        summary["ttft_growth"] = growth
        if growth is not None and growth["grew"]:
            offered = summary["arrival_check"].get("achieved_rate")
            rates = f"{len(ok) / duration:.3g} req/s completed"
            rates += f" of {offered:.3g} arriving" if offered else ""
            warnings.append(
                f"TTFT grew through the run: median {growth['first_quarter_p50_s']:.3g} s for "
                f"the requests that arrived in its first quarter, "
                f"{growth['last_quarter_p50_s']:.3g} s in its last. Requests queued faster than "
                f"the server finished them ({rates}): these latencies depend on how long the "
                "run lasted, not only on its load"
            )
    summary["warnings"] = warnings
    return summary


GROWTH_MIN_REQUESTS = 20  # in each quarter: fewer cannot tell a trend from noise
GROWTH_FACTOR, GROWTH_MIN_S = 2.0, 0.05


def ttft_growth(arrived: np.ndarray, ttft: np.ndarray) -> dict[str, Any] | None:
    """Did TTFT (with any wait for a slot) grow through an open-loop run? Where the load is
    above what the server finishes, the queue and every request's wait grow with the run's
    length: the figures then describe this run's duration, not a steady state. Compares the
    medians of the requests that arrived in the first and in the last quarter of the arrival
    span; None where either quarter has too few requests to tell."""
    if not len(arrived):
        return None
    start, stop = float(arrived.min()), float(arrived.max())
    quarter = (stop - start) / 4
    first, last = ttft[arrived <= start + quarter], ttft[arrived >= stop - quarter]
    if min(len(first), len(last)) < GROWTH_MIN_REQUESTS:
        return None
    a, b = float(np.median(first)), float(np.median(last))
    grew = b > GROWTH_FACTOR * a and b - a > GROWTH_MIN_S
    return {"first_quarter_p50_s": a, "last_quarter_p50_s": b, "grew": grew}


def _any_slo(slo: SLO, class_slos: Mapping[str, SLO]) -> bool:
    return bool(slo.as_dict()) or any(s.as_dict() for s in class_slos.values())


def summarize_classes(
    records: Sequence[RequestRecord],
    duration_s: float,
    arrivals: Mapping[str, Arrivals],
    slos: Mapping[str, SLO],
    max_p99_lag_s: float = DEFAULT_MAX_P99_LAG_S,
) -> dict[str, dict[str, Any]]:
    """The summary of each traffic class (in `slos`' order) on its own records: the same
    fields as the run's, throughputs over the run's duration, goodput by the class's SLO and
    the arrival check against the class's own process."""
    out = {}
    for name, slo in slos.items():
        mine = [r for r in records if r.cls == name]
        summary = summarize(mine, duration_s, arrivals.get(name), slo, max_p99_lag_s)
        summary.pop("definitions")  # the run's summary holds them once
        out[name] = summary
    return out


def _cached(ok: Sequence[RequestRecord]) -> int | None:
    told = [r.cached_tokens for r in ok if r.cached_tokens is not None]
    return sum(told) if told else None


def peak_output_throughput(ok: Sequence[RequestRecord], chunks: TokenTimes | None = None) -> float:
    """vLLM's peak: output tokens binned into whole seconds after the first send, by the time
    their chunk arrived; the fullest bin. Tokens, not chunks, so multi-token chunks count."""
    if not ok:
        return 0.0
    chunks = chunks or TokenTimes.of(ok)
    if chunks.times.size == 0:
        return 0.0
    t0 = min(r.send_s for r in ok)  # type: ignore[type-var]
    bins = np.floor(chunks.times - t0).astype(np.int64)
    return float(np.bincount(bins, weights=chunks.tokens).max())


def peak_concurrency(ok: Sequence[RequestRecord]) -> int:
    """Most requests in flight at once: a sweep over half-open [send, end) intervals (an end
    and a send at the same instant do not overlap), as vLLM counts it."""
    events = sorted([(r.send_s, 1) for r in ok] + [(r.end_s, -1) for r in ok])  # -1 first
    peak = now = 0
    for _, step in events:
        now += step
        peak = max(peak, now)
    return peak


def arrival_check(records: Sequence[RequestRecord], arrivals: Arrivals) -> dict[str, Any]:
    """Did requests arrive as the target process says? Compares achieved inter-arrival gaps
    (send - queue, in schedule order) with the target distribution (one-sample KS, Poisson and
    gamma) and with the schedule's own gaps (two-sample KS: the client's distortion)."""
    sent = sorted(
        (r.index, r.scheduled_s, r.send_s - r.queue_s) for r in records if r.send_s is not None
    )
    out: dict[str, Any] = {"process": arrivals.kind, "n": len(sent)}
    if len(sent) < 3:
        return out
    scheduled = np.diff([s for _, s, _ in sent])
    achieved = np.diff([a for _, _, a in sent])
    span = sent[-1][2] - sent[0][2]
    sched_span = sent[-1][1] - sent[0][1]
    out["achieved_rate"] = (len(sent) - 1) / span if span > 0 else None
    out["scheduled_rate"] = (len(sent) - 1) / sched_span if sched_span > 0 else None
    if arrivals.ramp is not None:
        r = arrivals.ramp
        out["ramp"] = {"strategy": r.strategy, "start_rps": r.start, "end_rps": r.end}
    elif arrivals.kind != "trace":
        out["target_rate"] = arrivals.rate
    n = len(achieved)
    d2 = ks_two_sample(achieved, scheduled)
    out["ks_vs_schedule"] = {"statistic": d2, "p_value": ks_pvalue(d2, n / 2)}
    cdf = arrivals.gap_cdf()
    if cdf is not None:
        d1 = ks_statistic(achieved, cdf)
        out["ks_vs_target"] = {"statistic": d1, "p_value": ks_pvalue(d1, n)}
        out["achieved_gap_cv"] = float(achieved.std() / achieved.mean())
    return out
