"""Metric definitions on hand-made records, and backends against misbehaving servers:
every failure becomes a record that says what went wrong, never a crash."""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from loadgen.arrivals import Arrivals
from loadgen.backends import OpenAIBackend
from loadgen.metrics import DISTRIBUTIONS, SLO, STATS, distribution, summarize
from loadgen.records import RecordWriter, RequestRecord, TimeTexts, TokenTimes, read_records
from loadgen.workload import RequestSpec


def rec(i: int, send: float, chunks: list[float], tokens: int, **kw: object) -> RequestRecord:
    r = RequestRecord(i, f"r{i}", 10, tokens, scheduled_s=send, send_s=send, **kw)
    r.chunk_s, r.chunk_tokens = chunks, [1] * len(chunks)
    r.first_chunk_s, r.end_s = chunks[0], chunks[-1]
    r.prompt_tokens, r.output_tokens, r.status = 10, tokens, "ok"
    return r


def test_definitions_on_known_records() -> None:
    a = rec(0, 0.0, [0.5, 0.6, 0.7, 0.8], 4)  # TTFT .5, ITLs .1, TPOT .1, E2E .8
    b = rec(1, 1.0, [1.2, 1.6], 2)  # TTFT .2, ITL .4, TPOT .4, E2E .6
    failed = RequestRecord(2, "r2", 10, 4, scheduled_s=1.5, send_s=1.5, status="error")
    warm = rec(3, -5.0, [-4.0, -3.0], 2, warmup=True)
    s = summarize([a, b, failed, warm], duration_s=2.0, slo=SLO(ttft=0.3))
    assert s["ttft_s"]["mean"] == pytest.approx(0.35)
    assert s["ttft_s"]["max"] == pytest.approx(0.5)
    assert s["itl_s"]["count"] == 4 and s["itl_s"]["max"] == pytest.approx(0.4)
    assert s["itl_s"]["mean"] == pytest.approx((0.1 * 3 + 0.4) / 4)  # pooled over requests
    assert s["tpot_s"]["mean"] == pytest.approx((0.1 + 0.4) / 2)  # per request
    assert s["e2e_s"]["p50"] == pytest.approx(0.7)
    assert s["completed"] == 2 and s["failed"] == 1
    assert s["request_throughput"] == pytest.approx(1.0)
    assert s["output_throughput"] == pytest.approx(3.0)
    assert s["total_token_throughput"] == pytest.approx(13.0)
    assert s["goodput"] == pytest.approx(0.5)  # only b met TTFT <= 0.3
    assert s["schedule_lag_s"]["max"] == 0.0
    assert "tpot" in s["definitions"] and any("failed" in w for w in s["warnings"])


def test_single_token_requests_have_no_tpot_and_pass_a_tpot_slo() -> None:
    s = summarize([rec(0, 0.0, [0.1], 1)], 1.0, slo=SLO(tpot=0.01))
    assert s["tpot_s"]["count"] == 0 and s["itl_s"]["count"] == 0
    assert s["goodput"] == pytest.approx(1.0)


def test_late_sends_make_a_run_invalid() -> None:
    recs = [rec(i, float(i), [i + 0.1, i + 0.2], 2) for i in range(10)]
    recs[-1].send_s = 9.05  # 50 ms late
    s = summarize(recs, 10.0, max_p99_lag_s=0.010)
    assert not s["valid"] and any("fell behind" in w for w in s["warnings"])
    assert summarize(recs[:-1], 10.0)["valid"]


def test_a_queue_that_builds_up_through_an_open_loop_run_is_told() -> None:
    """100 arrivals a second for 1 s: served at once, TTFT stays 50 ms; served 20 % slower
    than they come, each waits for all before it (the last quarter's median TTFT ~3x the
    first's), which makes the latencies a matter of the run's length."""
    poisson = Arrivals("poisson", rate=100.0)

    def run(service_s: float) -> list[RequestRecord]:
        recs, free = [], 0.0
        for i in range(100):
            start = max(i / 100, free)
            free = start + service_s
            recs.append(rec(i, i / 100, [start + 0.05, start + 0.06], 2))
        return recs

    steady = summarize(run(0.005), 1.2, poisson)
    assert not steady["ttft_growth"]["grew"] and not steady["warnings"]
    slow = summarize(run(0.012), 1.3, poisson)
    growth = slow["ttft_growth"]
    assert growth["grew"] and growth["last_quarter_p50_s"] > 2 * growth["first_quarter_p50_s"]
    assert any("TTFT grew through the run" in w for w in slow["warnings"])
    assert "76.9 req/s completed of 100 arriving" in slow["warnings"][0]
    assert summarize(run(0.012), 1.3)["warnings"] == []  # a closed loop: no arrival rate to beat
    assert summarize(run(0.012)[:60], 1.3, poisson)["ttft_growth"] is None  # quarters of 15


def test_short_outputs_warn() -> None:
    r = rec(0, 0.0, [0.1, 0.2], 2)
    r.output_len = 8  # asked for 8, got 2: the server stopped at EOS
    assert any("fewer output tokens" in w for w in summarize([r], 1.0)["warnings"])


@pytest.mark.parametrize(
    ("text", "error"),
    [("ttft=0.5,tpot=x", "not a number"), ("latency=1", "expected"), ("e2e=0", "> 0")],
)
def test_bad_slo(text: str, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        SLO.parse(text)


def test_goodput_counts_the_queue_wait_a_user_sees() -> None:
    queued = rec(0, 0.0, [0.1, 0.2], 2, queue_s=0.5)  # TTFT 0.1, but 0.6 behind the cap
    s = summarize([queued, rec(1, 0.0, [0.1, 0.2], 2)], 1.0, slo=SLO(ttft=0.3))
    assert s["goodput"] == pytest.approx(1.0)  # only the unqueued one
    assert s["ttft_with_queue_s"]["max"] == pytest.approx(0.6)


def test_chunks_stamped_together_warn() -> None:
    r = rec(0, 0.0, [0.1, 0.2, 0.2, 0.2, 0.3], 5)  # three chunks came in one read
    s = summarize([r], 1.0)
    assert s["itl_s"]["count"] == 4 and any("ITL gaps are 0" in w for w in s["warnings"])


def test_slo_parse_and_empty_distribution() -> None:
    assert SLO.parse("ttft=0.5, tpot=0.05,e2e=10") == SLO(0.5, 0.05, 10.0)
    assert SLO.parse(None).as_dict() == {}
    assert distribution([])["count"] == 0 and distribution([])["p99"] is None


def test_records_round_trip_through_jsonl(tmp_path: Path) -> None:
    writer = RecordWriter(tmp_path / "requests.jsonl")
    a = rec(0, 0.0, [0.5, 0.6], 2)
    b = RequestRecord(1, "r1", 3, 4, status="cancelled", error="stopped")
    writer.write(a)
    writer.write(b)  # flushed at once: readable before close
    back = read_records(tmp_path / "requests.jsonl")
    writer.close()
    assert back[0] == a
    assert back[1].status == "cancelled" and math.isnan(back[1].scheduled_s)


def test_preformatted_times_write_the_same_line() -> None:
    """TimeTexts (a simulation's records' times, formatted as it stamped them) change how a
    line is made, never what; a list made for other times than the record's is not used."""
    times = [0.1, 1 / 3, 2.0000004, 12345.6789]
    r = rec(0, 0.0, times, 4)
    texts = TimeTexts({"r0": (4, "[0.100000,0.333333,2.000000,12345.678900]")})
    assert r.to_json(texts.take(r)) == r.to_json() and "r0" not in texts
    texts["r0"] = (3, "[0.100000,0.333333,2.000000]")  # the record lost or gained a time since
    assert texts.take(r) is None
    assert json.loads(r.to_json())["chunk_s"] == [0.1, 0.333333, 2.0, 12345.6789]


def test_peak_concurrency_counts_completed_requests_in_flight_over_send_to_end() -> None:
    a = rec(0, 0.0, [0.2, 1.0], 2)  # in flight [0, 1)
    b = rec(1, 0.5, [0.7, 2.0], 2)  # [0.5, 2)
    c = rec(2, 0.6, [0.7, 0.9], 2)  # [0.6, 0.9): a, b and c at once
    d = rec(3, 1.0, [1.1, 1.5], 2)  # starts as a ends: b and d only
    e = rec(4, 2.0, [2.1, 2.2], 2)  # starts as b ends
    failed = RequestRecord(5, "r5", 10, 2, scheduled_s=0.1, send_s=0.1, end_s=1.9)
    failed.status = "error"  # in flight too, but vLLM counts completed requests only
    warm = rec(6, 0.1, [0.5, 1.8], 2, warmup=True)
    s = summarize([a, b, c, d, e, failed, warm], 3.0)
    assert s["peak_concurrent_requests"] == 3
    assert summarize([a, d, e], 3.0)["peak_concurrent_requests"] == 1  # touching: no overlap
    assert summarize([], 1.0)["peak_concurrent_requests"] == 0


def test_peak_output_throughput_bins_tokens_by_second_from_the_first_send() -> None:
    a = rec(0, 0.7, [0.8, 1.5, 1.6], 3)  # 0.1, 0.8, 0.9 s after the first send: bin 0
    b = rec(1, 0.9, [1.8, 2.0], 5)  # bin 1, carrying 2 + 3 tokens
    b.chunk_tokens = [2, 3]
    c = rec(2, 1.0, [2.6, 2.8], 2)  # bin 1 (1.9 and 2.1 s: bins 1 and 2)
    s = summarize([a, b, c], 3.0)
    # bins from the first send: 3, 5 + 1, 1 tokens; bins on the clock's whole seconds would
    # give 1, 4, 5; one per chunk (not per token) 3, 3, 1.
    assert s["peak_output_throughput"] == 6.0
    assert summarize([a], 3.0)["peak_output_throughput"] == 3.0  # floor(t) bins would say 2
    assert summarize([], 1.0)["peak_output_throughput"] == 0.0


# ---- backends against misbehaving servers ------------------------------------------------

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


async def _serve_and_send(
    handler: Handler, timeout_s: float = 5.0, **backend_kw: Any
) -> RequestRecord:
    app = web.Application()
    app.router.add_post("/v1/completions", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    url = f"http://127.0.0.1:{port}/v1"
    backend = OpenAIBackend(url, "m", timeout_s=timeout_s, **backend_kw)
    await backend.start()
    r = RequestRecord(0, "r0", 3, 4)
    try:
        await backend.send(RequestSpec("hi", 3, 4), r, 0.0)
    finally:
        await backend.close()
        await runner.cleanup()
    return r


async def _stream(request: web.Request, *events: bytes) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    for e in events:
        await resp.write(e)
    return resp


def _data(obj: object) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


async def _bad_request(request: web.Request) -> web.Response:
    body = {"error": {"message": "max_tokens is too large", "type": "invalid_request_error"}}
    return web.json_response(body, status=400)


async def _error_mid_stream(request: web.Request) -> web.StreamResponse:
    ok = _data({"choices": [{"index": 0, "text": "a"}]})
    return await _stream(request, ok, _data({"error": {"message": "engine died"}}))


async def _garbage(request: web.Request) -> web.StreamResponse:
    return await _stream(request, b"data: {not json\n\n")


async def _no_output(request: web.Request) -> web.StreamResponse:
    return await _stream(
        request, _data({"choices": [{"index": 0, "text": ""}]}), b"data: [DONE]\n\n"
    )


async def _done_then_hang(request: web.Request) -> web.StreamResponse:
    last = {"index": 0, "text": "a", "finish_reason": "length"}
    resp = await _stream(request, _data({"choices": [last]}))
    await resp.write(b"data: [DONE]\n\n")
    await asyncio.sleep(3)  # a proxy holding the stream open: [DONE] must end the read
    return resp


async def _usage_without_blank_line(request: web.Request) -> web.StreamResponse:
    text = _data({"choices": [{"index": 0, "text": "a b", "finish_reason": "length"}]})
    usage = _data({"choices": [], "usage": {"completion_tokens": 2}})
    return await _stream(request, text, usage, b"data: [DONE]")  # no closing blank line


def test_done_ends_the_read_and_a_last_unterminated_event_counts() -> None:
    r = asyncio.run(_serve_and_send(_done_then_hang, timeout_s=1.0))
    assert r.status == "ok" and r.end_s is not None and r.send_s is not None
    assert r.end_s - r.send_s < 0.9
    r = asyncio.run(_serve_and_send(_usage_without_blank_line))
    assert r.status == "ok" and r.output_tokens_source == "usage" and r.output_tokens == 2


async def _aborted(request: web.Request) -> web.StreamResponse:
    """A server shutting down: the stream ends normally, its finish_reason says it gave up."""
    text = _data({"choices": [{"index": 0, "text": "a b"}]})
    abort = _data({"choices": [{"index": 0, "text": "", "finish_reason": "abort"}]})
    return await _stream(request, text, abort, b"data: [DONE]\n\n")


async def _cut(request: web.Request) -> web.StreamResponse:
    """A server killed mid-stream: two chunks, then the connection closes, no [DONE]."""
    resp = await _stream(request, _data({"choices": [{"index": 0, "text": "a"}]}))
    await resp.write(_data({"choices": [{"index": 0, "text": " b"}]}))
    request.transport.close()  # type: ignore[union-attr]
    return resp


@pytest.mark.parametrize(
    ("handler", "error"),
    [(_aborted, "finish_reason 'abort'"), (_cut, "")],
)
def test_aborted_and_cut_streams_fail_and_keep_their_partial_data(
    handler: Handler, error: str
) -> None:
    r = asyncio.run(_serve_and_send(handler, timeout_s=2.0))
    assert r.status == "error" and error in (r.error or ""), r.error
    assert r.chunk_s and r.first_chunk_s == r.chunk_s[0]  # kept, not measured
    assert r.output_tokens >= 1
    s = summarize([r], 1.0)
    assert s["completed"] == 0 and s["failed"] == 1 and s["ttft_s"]["count"] == 0


async def _slow(request: web.Request) -> web.StreamResponse:
    await asyncio.sleep(3)
    return await _stream(request, b"data: [DONE]\n\n")


@pytest.mark.parametrize(
    ("handler", "status", "error"),
    [
        (_bad_request, 400, "max_tokens is too large"),
        (_error_mid_stream, 200, "engine died"),
        (_garbage, 200, "JSONDecodeError"),
        (_no_output, 200, "without any output"),
        (_slow, None, "TimeoutError"),
    ],
)
def test_failures_become_records(handler: Handler, status: int | None, error: str) -> None:
    r = asyncio.run(_serve_and_send(handler, timeout_s=0.5))
    assert r.status == "error" and r.http_status == status
    assert error in (r.error or "")


def test_a_refused_connection_is_a_failed_record() -> None:
    async def go() -> RequestRecord:
        backend = OpenAIBackend("http://127.0.0.1:9/v1", "m", timeout_s=2)
        await backend.start()
        r = RequestRecord(0, "r0", 1, 1)
        await backend.send(RequestSpec("hi", 1, 1), r, 0.0)
        await backend.close()
        return r

    r = asyncio.run(go())
    assert r.status == "error" and "Connect" in (r.error or "")
    assert "(POST http://127.0.0.1:9/v1/completions)" in (r.error or "")  # names the URL


# ---- the runner's bookkeeping ------------------------------------------------------------


class _SlowBackend:
    name = "slow"

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    async def send(self, spec: RequestSpec, rec: RequestRecord, t0: float) -> None:
        import time

        rec.send_s = time.perf_counter() - t0
        await asyncio.sleep(10)


def test_stopping_records_every_request_made_even_those_never_started() -> None:
    """Stop the moment the dispatcher has launched 50 tasks that have not run yet: each
    still gets exactly one record, cancelled."""
    from loadgen.load_plan import LoadPlan
    from loadgen.runner import LoadRunner

    async def go() -> tuple[LoadRunner, list[RequestRecord]]:
        plan = LoadPlan(iter([RequestSpec("p", 1, 1)] * 50), [0.0] * 50)
        seen: list[RequestRecord] = []
        runner = LoadRunner(_SlowBackend(), plan, seen.append)
        task = asyncio.create_task(runner.run())
        while runner.progress.sent < 50:
            await asyncio.sleep(0)
        runner.stop()
        outcome = await task
        assert outcome.interrupted and len(outcome.records) == 50
        return runner, seen

    runner, seen = asyncio.run(go())
    assert len(seen) == 50 and len({r.request_id for r in seen}) == 50
    assert {r.status for r in seen} == {"cancelled"}
    assert runner.progress.failed == 50 and runner.progress.in_flight == 0


def test_the_distribution_list_names_every_distribution_a_summary_holds() -> None:
    r = rec(0, 0.0, [0.5, 0.6, 0.7], 6)
    r.chunk_tokens = [2, 2, 2]  # multi-token chunks add itl_per_token_s
    s = summarize([r], 1.0)
    held = {k for k, v in s.items() if isinstance(v, dict) and "count" in v}
    assert held == set(DISTRIBUTIONS)
    assert all(set(s[k]) == {*STATS, "count"} for k in held)


class _FailingBackend:
    """The test request succeeds; then every request fails with `errors[i % len(errors)]`."""

    name = "failing"

    def __init__(self, errors: list[str]) -> None:
        self.errors, self.sent = errors, 0

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    async def send(self, spec: RequestSpec, rec: RequestRecord, t0: float) -> None:
        import time

        rec.send_s = time.perf_counter() - t0
        await asyncio.sleep(0.001)
        if rec.index < 0:  # the probe
            rec.status, rec.first_chunk_s, rec.end_s = "ok", rec.send_s, rec.send_s
            return
        rec.status, rec.error = "error", self.errors[self.sent % len(self.errors)]
        self.sent += 1


def _run_failing(errors: list[str], n: int, closed: bool = False):
    from loadgen.load_plan import LoadPlan
    from loadgen.runner import LoadRunner

    specs = iter([RequestSpec("p", 1, 1)] * n)
    probe = RequestSpec("p", 1, 1)
    if closed:
        plan = LoadPlan(specs, None, concurrency=2, num_requests=n, probe=probe)
    else:
        plan = LoadPlan(specs, [0.002 * i for i in range(n)], probe=probe)
    backend = _FailingBackend(errors)
    return asyncio.run(LoadRunner(backend, plan).run()), backend


@pytest.mark.parametrize("closed", [False, True])
def test_a_run_whose_first_requests_all_fail_alike_stops_early(closed: bool) -> None:
    """Before, the whole load was sent (200 requests here) though the first ten had all
    failed the same way; digits do not make errors differ (token counts, ports)."""
    errors = [f"prompt of {k} tokens is over the limit" for k in (300, 301)]
    outcome, backend = _run_failing(errors, 200, closed)
    assert outcome.stopped_early and "the first 10 requests all failed alike" in (
        outcome.stopped_early
    )
    assert "over the limit" in outcome.stopped_early
    assert not outcome.interrupted  # not a Ctrl-C: exit 1, not 130
    assert backend.sent < 50 and len(outcome.records) < 50


def test_different_failures_or_a_short_run_are_not_stopped_early() -> None:
    outcome, backend = _run_failing(["refused", "timed out"], 40)
    assert outcome.stopped_early is None and backend.sent == 40
    outcome, backend = _run_failing(["refused"], 10)  # the whole load is its first ten
    assert outcome.stopped_early is None and backend.sent == 10


def test_headers_sampling_and_extra_body_reach_the_server() -> None:
    """--header, --temperature/--top-p/--top-k and --extra-body go into every request; the
    extra body is merged last (it may override anything, as vLLM's does)."""
    from loadgen.benchmark import Target, connect
    from loadgen.profiles import build_config

    seen: dict[str, Any] = {}

    async def handler(request: web.Request) -> web.StreamResponse:
        seen["headers"], seen["body"] = dict(request.headers), await request.json()
        return await _stream(
            request,
            b'data: {"choices": [{"text": "x", "finish_reason": "stop"}]}\n\n',
            b"data: [DONE]\n\n",
        )

    flags = {
        "rate": 1.0,
        "num_requests": 1,
        "base_url": "http://h/v1",
        "model": "m",
        "api_key": "sk-1",
        "headers": ["X-Priority=high", "X-Team: infra"],
        "temperature": 0.7,
        "top_k": 5,
        "extra_body": '{"min_p": 0.1, "top_k": 7}',
    }
    cfg = build_config({}, flags, set())
    kw = {
        k: getattr(connect(cfg, Target.external("http://h/v1"), None), k)
        for k in ("sampling", "extra_body")
    }
    r = asyncio.run(_serve_and_send(handler, headers=cfg.headers, **kw))
    assert r.status == "ok", r.error
    assert seen["headers"]["X-Priority"] == "high" and seen["headers"]["X-Team"] == "infra"
    body = seen["body"]
    assert (body["temperature"], body["top_k"], body["min_p"]) == (0.7, 7, 0.1)
    assert "top_p" not in body  # not given: the server's default


def test_pooled_gaps_are_each_records_own() -> None:
    """TokenTimes (the summary's and report's pooled ITLs) against itl_s() record by record:
    one-sequence records, empty and one-chunk ones, and n > 1 choices told apart."""
    plain = rec(0, 0.0, [0.5, 0.6, 0.9], 3)
    one = rec(1, 1.0, [1.5], 1)
    empty = RequestRecord(2, "r2", 10, 4, scheduled_s=1.5, send_s=1.5)
    parallel = rec(3, 2.0, [2.1, 2.2, 2.4, 2.7, 3.0], 5, n=2)
    parallel.chunk_choice = [0, 1, 0, 1, 0]  # choice 0: .1 .4 .7 -> .3 .3; choice 1: .5
    untold = rec(4, 3.0, [3.1, 3.3], 2, n=2)  # choices not told apart: successive chunks
    later = rec(5, 4.0, [4.5, 4.75], 2)
    records = [plain, one, empty, parallel, untold, later]
    chunks = TokenTimes.of(records)
    assert chunks.counts.tolist() == [3, 1, 0, 5, 2, 2]
    pooled = sorted(chunks.gaps(records).tolist())
    expected = sorted(g for r in records for g in r.itl_s().tolist())
    assert pooled == pytest.approx(expected) and len(pooled) == 2 + 3 + 1 + 1
