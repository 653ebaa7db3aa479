"""The worker side of `bench run --workers N`: one process sending its share of a schedule
split by arrival index, with its own event loop and HTTP client, and streaming its records
back to the driver (loadgen/split_runner.py) as they end.

Every time is perf_counter() relative to the t0 the driver gives: on Linux perf_counter is
CLOCK_MONOTONIC, one clock for every process of a machine, so the workers' records share one
zero and merge as if one process had sent them. Records keep the whole schedule's numbering
(index, request id), so the merged requests.jsonl is the one a single process writes.

A worker ignores SIGINT and SIGTERM (Ctrl-C reaches the whole process group): the driver
stops it, and a worker whose driver is gone (its command pipe closes) stops itself."""

from __future__ import annotations

import asyncio
import pickle
import queue
import signal
import sys
import threading
import traceback
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

from loadgen.backends import Backend
from loadgen.event_loop import run_event_loop
from loadgen.load_plan import LoadPlan
from loadgen.records import RequestRecord
from loadgen.runner import LoadRunner, ProbeFailed
from loadgen.sessions import Session
from loadgen.worker_feed import FedRunner, Feed
from loadgen.workload import RequestSpec

FLUSH_S = 0.02  # records go to the driver in batches at most this old
PROGRESS_S = 0.1  # how often a worker tells the driver its counters (the live view)


@dataclass(slots=True)
class WorkerJob:
    """What one worker sends: its items of the schedule with their arrival indices (a closed
    loop: its first requests, the rest asked for), its warm-up requests with theirs, and
    (worker 0 only) the test request."""

    worker: int
    run_id: str
    backend: Backend  # not yet started: each worker opens its own connections
    offsets: list[float] | None  # None: a closed loop (loadgen/worker_feed.py)
    items: list[RequestSpec | Session]
    indices: list[int]  # each item's arrival index in the whole schedule
    warmup: list[RequestSpec]
    warmup_indices: list[int]
    probe: RequestSpec | None = None
    # multi-turn: the record index of each conversation's first turn (its turns follow)
    record_bases: list[int] | None = None
    slots: int | None = None  # its share of --concurrency (a closed loop's width, or a cap)
    duration_s: float | None = None  # a closed loop's limits, over the whole run
    num_requests: int | None = None
    exhausted: bool = False  # a closed loop: the driver has no more requests to give


class LazyTokenizer:
    """The run's tokenizer, unpickled on first use: it counts tokens only where a server's
    stream carries no usage, so a worker need not import the engine's tokenizer otherwise."""

    def __init__(self, tokenizer: Any) -> None:
        self._data = pickle.dumps(tokenizer)
        self._tokenizer: Any = None

    def __getstate__(self) -> bytes:
        return self._data

    def __setstate__(self, data: bytes) -> None:
        self._data, self._tokenizer = data, None

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        if self._tokenizer is None:
            self._tokenizer = pickle.loads(self._data)
        return getattr(self._tokenizer, name)


class Outbox:
    """Messages to the driver, sent by a thread of their own (pickling a batch and a full
    pipe must not hold up a send on schedule); records batched for up to FLUSH_S."""

    def __init__(self, conn: Connection, worker: int) -> None:
        self.conn, self.worker = conn, worker
        self._queue: queue.SimpleQueue[tuple | None] = queue.SimpleQueue()
        self._batch: list[RequestRecord] = []
        self._thread = threading.Thread(target=self._send_all, daemon=True)
        self._thread.start()

    def record(self, rec: RequestRecord) -> None:
        if not self._batch:
            asyncio.get_running_loop().call_later(FLUSH_S, self.flush)
        self._batch.append(rec)

    def flush(self) -> None:
        batch, self._batch = self._batch, []
        if batch:
            for rec in batch:
                rec.reply = ""  # the next turn has read it; it is not kept on disk
            self.put(("records", self.worker, batch))

    def put(self, message: tuple) -> None:
        self._queue.put(message)

    def close(self) -> None:
        self.flush()
        self._queue.put(None)
        self._thread.join()

    def _send_all(self) -> None:
        while (message := self._queue.get()) is not None:
            try:
                self.conn.send(message)
            except OSError:  # the driver is gone: nobody to tell
                return


def worker_main(job: WorkerJob, commands: Connection, results: Connection) -> None:
    """A worker process's entry (multiprocessing, spawn)."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    if not run_worker(job, commands, results):
        sys.exit(1)


def run_worker(job: WorkerJob, commands: Any, results: Any) -> bool:
    """The worker's whole life, whatever carries its messages: multiprocessing's pipes here,
    queues behind a Ray actor's methods in loadgen/ray_runner.py (anything with the
    Connection's recv and send). False when it raised (its traceback sent as "error")."""
    out = Outbox(results, job.worker)
    try:
        run_event_loop(_work(job, commands, out))
    except BaseException:
        out.put(("error", job.worker, traceback.format_exc()))
        out.close()
        return False
    out.close()
    return True


async def _work(job: WorkerJob, commands: Connection, out: Outbox) -> None:
    loop = asyncio.get_running_loop()
    waiting: dict[str, asyncio.Future[float]] = {}

    async def gate(phase: str) -> float:
        waiting[phase] = loop.create_future()
        out.put(("gate", job.worker, phase))
        return await waiting[phase]

    feed = None
    if job.offsets is None:  # a closed loop: its requests come from the driver as it asks
        feed = Feed(job, lambda count: out.put(("want", job.worker, count)))
        plan = LoadPlan(
            iter(()),
            None,
            job.slots,
            job.num_requests,
            job.duration_s,
            warmup=job.warmup,
            probe=job.probe,
        )
        indices, bases = feed.indices, feed.bases
    else:
        plan = LoadPlan(
            iter(job.items),
            job.offsets,
            job.slots,
            warmup=job.warmup,
            probe=job.probe,
            total_requests=_requests_in(job.items),
        )
        indices, bases = job.indices, job.record_bases
    # A run id of its own while running: a record renamed to the whole run's numbering can
    # never take the name of another this runner has not finished yet.
    args = (job.backend, plan, _renumbering(job, out.record, indices, bases))
    run_id = f"{job.run_id}@{job.worker}"
    if feed is None:
        runner = LoadRunner(*args, run_id, gate=gate)
    else:
        runner = FedRunner(feed, *args, run_id, gate=gate)

    def command(message: tuple) -> None:
        if message[0] == "stop":
            runner.stop()
        elif message[0] == "go" and not waiting[message[1]].done():
            waiting[message[1]].set_result(message[2])
        elif message[0] == "items" and feed is not None:
            feed.give(message[1], message[2])

    threading.Thread(target=_read_commands, args=(commands, loop, command), daemon=True).start()
    reporter = asyncio.create_task(_report_progress(runner, out))
    probe_error = None
    elapsed = None
    try:
        outcome = await runner.run()
        elapsed, stopped_early = outcome.elapsed_s, outcome.stopped_early
    except ProbeFailed as e:
        probe_error, stopped_early = str(e), None
    finally:
        reporter.cancel()
    probe = runner.probe_record
    if probe is not None:
        probe.request_id = f"{job.run_id}-probe"
        probe.reply = ""
    out.flush()
    _progress(runner, out)  # the last counters: the live view's final frame shows them
    out.put(("done", job.worker, elapsed, stopped_early, probe, probe_error))


def _renumbering(job: WorkerJob, send: Any, indices: list[int], bases: list[int] | None) -> Any:
    """The worker's records renamed to the whole run's numbering, then sent: `indices` (and,
    multi-turn, `bases`) give each of its items' global number by its own."""

    def renumber(rec: RequestRecord) -> None:
        if rec.warmup:
            rec.index = job.warmup_indices[rec.index]
        elif rec.session is not None and bases is not None:
            rec.index = bases[rec.session] + (rec.turn or 0)
            rec.session = indices[rec.session]
        else:
            rec.index = indices[rec.index]
        rec.request_id = f"{job.run_id}-{'w' if rec.warmup else ''}{rec.index}"
        rec.worker = job.worker
        send(rec)

    return renumber


def _requests_in(items: list[RequestSpec | Session]) -> int:
    return sum(len(x.turns) if isinstance(x, Session) else 1 for x in items)


def _read_commands(commands: Connection, loop: asyncio.AbstractEventLoop, handle: Any) -> None:
    """The driver's commands into the event loop; its pipe closing (the driver died) stops."""
    while True:
        try:
            message = commands.recv()
        except (EOFError, OSError):
            message = ("stop",)
        try:
            loop.call_soon_threadsafe(handle, message)
        except RuntimeError:  # the loop has ended
            return
        if message[0] == "stop":
            return


async def _report_progress(runner: LoadRunner, out: Outbox) -> None:
    while True:
        _progress(runner, out)
        await asyncio.sleep(PROGRESS_S)


def _progress(runner: LoadRunner, out: Outbox) -> None:
    p = runner.progress
    out.put(("progress", out.worker, p.sent, p.in_flight, runner.next_send, runner.phase))
