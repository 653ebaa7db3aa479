"""The load generator against a server that misbehaves (loadgen/mock_server.py's modes): what
a run records, prints and exits with when streams are cut, chunks are not objects, a 200 is a
JSON error, or an error message holds terminal escape sequences. One mock server serves every
mode (the request's model names it); issue 41 items 13, 14, 16 and 17."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from bench_cli.local_server import free_port
from bench_cli.run.execute import execute
from loadgen.backends import OpenAIBackend, _read_events
from loadgen.endpoints import resolve_base_url
from loadgen.mock_server import ESCAPE_ERROR, JSON_ERROR
from loadgen.records import RequestRecord
from loadgen.workload import RequestSpec

# A busy machine's schedule lag is not what these tests check (INVALID: test_run_lifecycle).
RUN = {"rate": 50.0, "num_requests": 6, "warmup": 0, "input_len": "8", "output_len": "4"}
RUN |= {"max_p99_lag_ms": 1000.0}


def _start(*args: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    cmd = [sys.executable, "-m", "loadgen.mock_server", "--port", str(port), *args]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1):
                return proc, f"http://127.0.0.1:{port}/v1"
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError(f"mock server did not start: {proc.stderr.read() if proc.stderr else ''}")


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    """One instant mock server for the module: each request's model picks its misbehaviour."""
    proc, base = _start("--ttft", "0", "--itl", "0")
    yield base
    proc.terminate()
    proc.wait(timeout=10)


def send_one(url: str, model: str, n: int = 1, **kw: Any) -> RequestRecord:
    """One request through the HTTP backend, as the runner sends it; its record."""
    spec = RequestSpec("a b c d", 4, 4, n=n)
    rec = RequestRecord(0, "r0", 4, 4, False, n=n)

    async def go() -> None:
        backend = OpenAIBackend(url, model, **kw)
        await backend.start()
        try:
            await backend.send(spec, rec, time.perf_counter())
        finally:
            await backend.close()

    asyncio.run(go())
    return rec


def bench_run(tmp_path: Path, url: str, model: str, **flags: Any) -> tuple[int, str, Path]:
    out = tmp_path / "run"
    buf = io.StringIO()
    flags = {**RUN, "base_url": url, "model": model, "out": str(out), **flags}
    rc = execute("default", flags, dashboard=False, console=Console(file=buf, width=200))
    return rc, buf.getvalue(), out


def records(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (out / "requests.jsonl").read_text().splitlines()]


# ---- what a request records ----------------------------------------------------------------


@pytest.mark.parametrize("n", [1, 2])
def test_a_well_behaved_stream_is_a_success(url: str, n: int) -> None:
    rec = send_one(url, "mock", n=n)
    assert (rec.status, rec.error, rec.output_tokens) == ("ok", None, 4 * n)


@pytest.mark.parametrize(
    ("n", "error"),
    [
        (1, "the stream was cut after 4 chunks (no [DONE])"),  # after its finish chunk
        (2, "the stream was cut after 7 chunks (no [DONE])"),  # choice 1 never finished
    ],
)
def test_a_cut_stream_is_a_failure_that_keeps_what_came(url: str, n: int, error: str) -> None:
    rec = send_one(url, "cut", n=n)
    assert (rec.status, rec.error) == ("error", error)
    assert rec.first_chunk_s is not None and rec.output_tokens == 4 * n - (n - 1)


def test_a_choice_without_its_finish_reason_fails_even_with_done() -> None:
    """[DONE] came, but one of n=2 choices never finished."""
    from aiohttp import web

    async def handler(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for index, finish in ((0, "length"), (1, None)):
            choice = {"index": index, "text": " x", "finish_reason": finish}
            await resp.write(b"data: " + json.dumps({"choices": [choice]}).encode() + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        return resp

    async def go() -> RequestRecord:
        app = web.Application()
        app.router.add_post("/v1/completions", handler)
        runner = web.AppRunner(app)
        await runner.setup()
        port = free_port()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        try:
            return await asyncio.to_thread(send_one, f"http://127.0.0.1:{port}/v1", "m", 2)
        finally:
            await runner.cleanup()

    rec = asyncio.run(go())
    assert rec.status == "error"
    assert rec.error == "the stream ended with 1 of 2 completions unfinished (no finish_reason)"


def test_a_chunk_that_is_not_an_object_fails_the_request(url: str) -> None:
    rec = send_one(url, "non-object")
    assert rec.status == "error"
    assert rec.error == "ValueError: a stream chunk is not a JSON object: b'1'"


def test_a_200_with_a_json_error_keeps_the_servers_message(url: str) -> None:
    rec = send_one(url, "json-error")
    assert (rec.status, rec.http_status, rec.error) == ("error", 200, JSON_ERROR)


def test_a_record_keeps_the_servers_raw_error_text(url: str) -> None:
    rec = send_one(url, "escape-error")
    assert (rec.status, rec.http_status, rec.error) == ("error", 400, ESCAPE_ERROR)


# ---- what a run prints, writes and exits with ----------------------------------------------


@pytest.mark.parametrize(
    ("model", "message"),
    [
        ("cut", "the stream was cut after 4 chunks (no [DONE])"),
        ("non-object", "a stream chunk is not a JSON object: b'1'"),
        ("json-error", JSON_ERROR),
    ],
)
def test_a_test_request_that_misbehaves_stops_the_run_with_its_message(
    tmp_path: Path, url: str, model: str, message: str
) -> None:
    rc, printed, _ = bench_run(tmp_path, url, model)
    flat = " ".join(printed.split())
    assert rc == 1, printed
    assert "test request" in flat and message in flat and "nothing was measured" in flat
    assert "Traceback" not in printed


@pytest.mark.parametrize(("n", "cut_after"), [(1, 4), (2, 7)])
def test_cut_streams_are_failed_records_and_stay_out_of_latency(
    tmp_path: Path, url: str, n: int, cut_after: int
) -> None:
    rc, printed, out = bench_run(tmp_path, url, f"cut@2+{n}", n=n, concurrency=1, rate=None)
    assert rc == 0, printed
    recs = records(out)
    failed = [r for r in recs if r["status"] != "ok"]
    assert len(recs) == 6 and len(failed) == 3
    assert {r["error"] for r in failed} == {
        f"the stream was cut after {cut_after} chunks (no [DONE])"
    }
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["completed"], summary["failed"]) == (3, 3)
    assert summary["ttft_s"]["count"] == 3
    assert "3 requests failed" in " ".join(printed.split())


def test_escape_sequences_from_the_server_never_reach_the_terminal(
    tmp_path: Path, url: str
) -> None:
    rc, printed, _ = bench_run(tmp_path, url, "escape-error")
    assert rc == 1
    assert not any(ch in printed for ch in "\x1b\x07\r\x08"), repr(printed)
    assert r"\x1b]0;pwned\x07" in printed  # shown, as escapes
    rc, printed, out = bench_run(tmp_path / "2", url, "escape-error@2", concurrency=1, rate=None)
    assert rc == 0 and "\x1b" not in printed and "the server says no" in printed
    errors = {r["error"] for r in records(out) if r["status"] != "ok"}
    assert errors == {ESCAPE_ERROR}  # the records keep it raw (JSON escapes it on disk)
    assert "\x1b" not in (out / "requests.jsonl").read_text()


# ---- credentials: sent, never written or printed (item 13) ---------------------------------


def test_credentials_are_sent_but_never_written_or_printed(tmp_path: Path) -> None:
    basic = base64.b64encode(b"user:s3cr3t-pw").decode()  # ends in '='
    assert basic.endswith("=")
    proc, url = _start(
        "--ttft", "0", "--itl", "0",
        "--require-header", f"Authorization: Basic {basic}",
        "--require-header", "X-Password: hunter2",
    )  # fmt: skip
    host = url.removeprefix("http://")
    secrets = ("s3cr3t-pw", basic, "hunter2", "sk-qwerty")
    try:
        given: list[dict[str, Any]] = [  # the same credentials in a URL and in a header
            {"base_url": f"http://user:s3cr3t-pw@{host}?api_key=sk-qwerty", "model": None},
            {"base_url": url, "headers": [f"Authorization: Basic {basic}"]},
        ]
        for k, flags in enumerate(given):
            flags["headers"] = [*flags.get("headers", []), "X-Password: hunter2"]
            rc, printed, out = bench_run(
                tmp_path / str(k), url, flags.pop("model", "mock"), **flags
            )
            assert rc == 0, printed
            assert json.loads((out / "summary.json").read_text())["completed"] == 6
            for text in (printed, *(p.read_text() for p in out.iterdir())):
                assert not any(secret in text for secret in secrets)
            config = json.loads((out / "config.json").read_text())
            assert config["run"]["headers"]["X-Password"] == "***"
        root = host.removesuffix("/v1")  # vLLM's convention: the root, /v1 found by asking
        given_root = f"http://user:s3cr3t-pw@{root}/?api_key=sk-qwerty"
        assert resolve_base_url(given_root) == f"http://user:s3cr3t-pw@{host}?api_key=sk-qwerty"
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    assert config["run"]["headers"]["Authorization"] == "***"
    shown = f"http://***@{host}?api_key=***"
    assert json.loads((tmp_path / "0/run/config.json").read_text())["target"]["base_url"] == shown


def test_printable_shows_control_and_format_characters_as_escapes() -> None:
    from loadgen.redact import printable

    assert printable("a\x1b[2Jb\x07\r\u202eé\n") == "a\\x1b[2Jb\\x07\\r\\u202eé\n"
    assert printable("x" * 5, limit=3) == "xxx..."


@pytest.mark.parametrize(
    ("bad", "error"),
    [
        (b"data: 1", "a stream chunk is not a JSON object: b'1'"),
        (b'data: {"choices": [', "Expecting value"),
    ],
)
def test_a_broken_event_among_good_ones_in_one_read_is_named(bad: bytes, error: str) -> None:
    """A read's events are parsed in one json.loads; a broken one among them still fails the
    request with its own message, and the events before it in that read still count."""
    backend = OpenAIBackend("http://127.0.0.1:1/v1", "m")
    good = [b'data: {"choices": [{"index": 0, "text": "t"}]}'] * 2
    rec = RequestRecord(index=0, request_id="r", input_len=1, output_len=4)
    datas, done, _ = _read_events(b"\n\n".join([*good, bad, *good, b""]))
    with pytest.raises(ValueError, match=error.replace("[", r"\[")):
        backend._take(datas, 0.5, rec, [], {}, set())
    assert rec.chunk_s == [0.5, 0.5] and not done
    rec = RequestRecord(index=0, request_id="r", input_len=1, output_len=4)
    datas, done, _ = _read_events(b"\n\n".join([*good, b"data: [DONE]", bad, b""]))
    assert done and not backend._take(datas, 0.5, rec, [], {}, set())
    assert rec.chunk_s == [0.5, 0.5]  # nothing after [DONE] is read
