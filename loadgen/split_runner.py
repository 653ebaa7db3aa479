"""`bench run --workers N`: one seeded load sent from N worker processes (loadgen/workers.py),
for loads past what one event loop keeps to.

An open-loop schedule is split by arrival index (item i goes to worker i mod N, or in
proportion to their slots under a --concurrency cap; a conversation is one item, so its turns
stay on one worker). A closed loop's C slots are split over the workers and its requests
handed out as they ask (loadgen/worker_slots.py). The driver lets the workers on together:
worker 0's test request first, then everyone's warm-up, then the load from one t0 it gives
them all. It writes their records to one requests.jsonl as they arrive, and is the runner the
live view and the summary read, as `LoadRunner` is for one process. A worker that dies fails
the run: the others are stopped, every record kept, and `failure` says which worker and why."""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing as mp
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any

from loadgen.backends import Backend
from loadgen.load_plan import LoadPlan
from loadgen.records import RequestRecord
from loadgen.runner import Progress, RunOutcome
from loadgen.worker_slots import Dispenser, closed_shares, open_shares, split_slots
from loadgen.workers import LazyTokenizer, WorkerJob, worker_main

START_DELAY_S = 0.1  # t0 this far after the last worker is ready: each hears of it by then
STOP_WAIT_S = 15.0  # a stopped worker has this long to send its last records, then is killed


def parse_workers(value: Any) -> int | str:
    """--workers N (a whole number >= 1) or `auto` (loadgen/worker_count.py picks N at start)."""
    if isinstance(value, str) and value.strip().lower() == "auto":
        return "auto"
    try:
        workers = int(value)
    except (TypeError, ValueError):
        raise ValueError(f"--workers {value!r}: expected a whole number >= 1") from None
    if isinstance(value, float | bool) or workers < 1:
        raise ValueError(f"--workers {value!r}: expected a whole number >= 1")
    return workers


def check_split(cfg: Any) -> None:
    """What a run from several worker processes cannot be: the engine in this process (it
    cannot be split across processes), or `auto` without a schedule to count from."""
    if cfg.ray_address and parse_workers(cfg.workers) == "auto":
        raise ValueError(
            "--ray-address with --workers auto: auto counts this machine's cores; give the "
            "number of Ray workers, e.g. --workers 4"
        )
    if parse_workers(cfg.workers) == 1 and not cfg.ray_address:
        return
    for given, what in (
        (cfg.in_process, "--in-process runs the bundled engine in this process"),
        (cfg.naive_batch is not None, "--naive-batch serves in this process"),
        (cfg.engine_kind == "sim", "--engine sim simulates the engine in this process"),
    ):
        if given:
            raise ValueError(
                f"--workers {cfg.workers}: {what}, which cannot be split across processes; "
                "worker processes need an HTTP server (--base-url, or the bundled server "
                "`bench run` starts without --in-process)"
            )
    if cfg.closed_loop and parse_workers(cfg.workers) == "auto":
        raise ValueError(
            "--workers auto with a closed loop (--concurrency alone): auto sizes the workers "
            "from a schedule's rate; give the number, e.g. --workers 2 (C slots are split "
            "over them)"
        )


@dataclass(slots=True)
class WorkerState:
    process: Any  # multiprocessing's SpawnProcess
    commands: Connection
    gate: str | None = None  # the gate it waits at
    sent: int = 0
    in_flight: int = 0
    next_send: float | None = None
    phase: str = "start-up"
    done: tuple | None = None  # (elapsed, stopped_early, probe record, probe error)
    error: str | None = None  # its traceback, when it raised
    exit_code: int | None = None
    records: int = 0
    clock_offset_s: float = 0.0  # its perf_counter minus the driver's (0: this machine)


class SplitRunner:
    def __init__(
        self,
        backend: Backend,
        plan: LoadPlan,
        workers: int,
        on_record: Callable[[RequestRecord], None] | None = None,
        run_id: str = "req",
    ) -> None:
        if not isinstance(workers, int):  # "auto": loadgen/worker_count.py resolves it first
            raise TypeError(f"workers={workers!r}: resolve --workers auto before the run")
        self.backend, self.plan, self.n = backend, plan, workers
        # each worker's share of --concurrency (worker_slots.fit_workers fits N to it first)
        self.slots = split_slots(plan.concurrency, workers) if plan.concurrency else None
        closed = plan.offsets is None
        self.dispenser = Dispenser(plan.specs, plan.num_requests) if closed else None
        self.on_record, self.run_id = on_record, run_id
        self.progress = Progress(total=plan.total)
        self.records: list[RequestRecord] = []
        self.warmup_records: list[RequestRecord] = []
        self.probe_record: RequestRecord | None = None
        self.t0 = 0.0
        self.next_send: float | None = None
        self.phase = "start-up"
        self.stop_signal: int | None = None
        self.stopped_early: str | None = None
        self.failure: str | None = None  # a worker died: the run failed
        self._stopped = False
        self._workers: list[WorkerState] = []
        self._events: asyncio.Queue[tuple] | None = None

    def stop(self, signum: int | None = None) -> None:
        """Stop every worker (Ctrl-C): each cancels what it has in flight and sends the
        records it made; the run then ends with them."""
        self.stop_signal = self.stop_signal or signum
        self._stop_all()

    def _stop_all(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        for w in self._workers:
            _tell(w, ("stop",))
        if self._events is not None:
            self._events.put_nowait(("wake",))

    def describe(self, summary: dict[str, Any]) -> None:
        """What the summary keeps of the workers beyond their records."""
        summary["worker_failure"] = self.failure
        summary["worker_slots"] = self.slots  # each worker's share of --concurrency

    def jobs(self) -> list[WorkerJob]:
        """Each worker's share, worker 0 with the test request: its items of the schedule
        (by arrival index), or a closed loop's first requests, one a slot."""
        plan, n = self.plan, self.n
        backend = self.backend
        tokenizer = getattr(backend, "tokenizer", None)
        if tokenizer is not None:
            backend = _with_tokenizer(backend, LazyTokenizer(tokenizer))
        weights = self.slots or [1] * n
        if self.dispenser is not None:  # closed loop: the rest handed out as they ask
            shares = closed_shares(self.dispenser, weights)
        else:
            assert plan.offsets is not None
            shares = open_shares(plan.specs, plan.offsets, weights)
        return [
            WorkerJob(
                w,
                self.run_id,
                backend,
                share.offsets,
                share.items,
                share.indices,
                plan.warmup[w::n],
                list(range(len(plan.warmup)))[w::n],
                plan.probe if w == 0 else None,
                share.bases,
                slots=self.slots[w] if self.slots else None,
                duration_s=plan.duration_s,
                num_requests=plan.num_requests,
                exhausted=self.dispenser is not None and self.dispenser.exhausted,
            )
            for w, share in enumerate(shares)
        ]

    async def run(self) -> RunOutcome:
        loop = asyncio.get_running_loop()
        self._events = asyncio.Queue()
        thread = await self._start_workers(loop, self._events)
        try:
            await self._lead()
        finally:
            self._stop_all()
            await self._until(
                lambda: all(w.exit_code is not None for w in self._workers), STOP_WAIT_S
            )
            for i, w in enumerate(self._workers):
                if w.exit_code is None:
                    w.process.kill()
                    self._fail(f"worker {i} did not stop within {STOP_WAIT_S:g} s: killed")
            await asyncio.to_thread(thread.join)
            for w in self._workers:
                w.process.join()
                w.commands.close()
        done = [w.done for w in self._workers if w.done is not None and w.done[0] is not None]
        elapsed = max((d[0] for d in done), default=0.0) if self.t0 else 0.0
        interrupted = self.stop_signal is not None and not self.stopped_early and not self.failure
        return RunOutcome(
            self.records, self.warmup_records, elapsed, interrupted, self.t0, self.stopped_early
        )

    async def _start_workers(
        self, loop: asyncio.AbstractEventLoop, events: asyncio.Queue
    ) -> threading.Thread:
        """A spawned process a job, and the thread that posts their messages to `events`
        (loadgen/ray_runner.py puts them on Ray actors instead)."""
        ctx = mp.get_context("spawn")
        readers = []
        for job in self.jobs():
            cmd_read, cmd_write = ctx.Pipe(duplex=False)
            res_read, res_write = ctx.Pipe(duplex=False)
            proc = ctx.Process(
                target=worker_main,
                args=(job, cmd_read, res_write),
                name=f"bench-worker-{job.worker}",
                daemon=True,
            )
            proc.start()
            cmd_read.close()  # the worker's ends: closed here, so a dead worker reads as EOF
            res_write.close()
            self._workers.append(WorkerState(proc, cmd_write))
            readers.append(res_read)
        thread = threading.Thread(target=_read_all, args=(readers, self._workers, loop, events))
        thread.start()
        return thread

    async def _lead(self) -> None:
        """The phases, each once every worker is at its gate: test request, warm-up, load."""
        workers = self._workers
        self.phase = "test request" if self.plan.probe is not None else "warm-up"
        await self._until(lambda: all(w.gate == "warm-up" or w.done for w in workers))
        if self._stopped:
            return
        self.phase = "warm-up"
        for w in workers:
            _tell(w, ("go", "warm-up", 0.0))
        await self._until(lambda: all(w.gate == "load" or w.done for w in workers))
        if self._stopped:
            return
        self.t0 = time.perf_counter() + START_DELAY_S
        self.phase = "load"
        for w in workers:  # each on its own clock (a Ray worker on another host)
            _tell(w, ("go", "load", self.t0 + w.clock_offset_s))
        await self._until(lambda: all(w.phase == "drain" or w.done for w in workers))
        if not self._stopped:
            self.phase = "drain"
        await self._until(lambda: all(w.done for w in workers))

    async def _until(self, ready: Callable[[], bool], timeout_s: float | None = None) -> None:
        """Handle the workers' messages until `ready()` (or the run stops, or the timeout)."""
        assert self._events is not None
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while not ready():
            if self._stopped and timeout_s is None:
                return
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return
            try:
                message = await asyncio.wait_for(self._events.get(), left)
            except TimeoutError:
                return
            self._handle(message)

    def _handle(self, message: tuple) -> None:
        kind = message[0]
        if kind == "wake":
            return
        w = self._workers[message[1]]
        if kind == "records":
            for rec in message[2]:
                self._record(rec, w)
        elif kind == "progress":
            w.sent, w.in_flight, w.next_send, w.phase = message[2:]
            self._progress()
        elif kind == "gate":
            w.gate = message[2]
        elif kind == "want":  # a closed loop's worker: more requests for its slots
            assert self.dispenser is not None
            items = self.dispenser.take(message[2])
            _tell(w, ("items", items, self.dispenser.exhausted))
        elif kind == "done":
            w.done = message[2:]
            _, stopped_early, probe, probe_error = w.done
            if probe is not None:
                self.probe_record = probe
            if probe_error or stopped_early:  # the test request failed, or fail-fast
                self.stopped_early = self.stopped_early or probe_error or stopped_early
                self._stop_all()
        elif kind == "error":
            w.error = message[2]
        elif kind == "exit":
            w.exit_code = message[2]
            if w.done is None:
                self._fail(f"worker {message[1]} (pid {w.process.pid}) died: {_why(w)}")

    def _fail(self, text: str) -> None:
        self.failure = self.failure or text
        self._stop_all()

    def _record(self, rec: RequestRecord, w: WorkerState) -> None:
        (self.warmup_records if rec.warmup else self.records).append(rec)
        if not rec.warmup:
            w.records += 1
            self.progress.completed += rec.ok
            self.progress.failed += not rec.ok
        if self.on_record is not None:
            self.on_record(rec)

    def _progress(self) -> None:
        workers = self._workers
        self.progress.sent = sum(w.sent for w in workers)
        self.progress.in_flight = sum(w.in_flight for w in workers)
        self.progress.warming_up = any(w.phase == "warm-up" for w in workers)
        sends = [w.next_send for w in workers if w.next_send is not None and w.phase == "load"]
        self.next_send = min(sends, default=None)


def _with_tokenizer(backend: Backend, tokenizer: Any) -> Backend:
    import copy

    backend = copy.copy(backend)
    backend.tokenizer = tokenizer  # type: ignore[attr-defined]
    return backend


def _tell(w: WorkerState, message: tuple) -> None:
    with contextlib.suppress(OSError):  # it has ended: its exit says how
        w.commands.send(message)


def _why(w: WorkerState) -> str:
    """A dead worker's reason: its exception's last line, the signal that killed it, or
    its exit code."""
    if w.error:
        return w.error.strip().splitlines()[-1]
    code = w.exit_code
    if code is not None and code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code} before it said it was done"


def _read_all(
    readers: list[Connection],
    workers: list[WorkerState],
    loop: asyncio.AbstractEventLoop,
    events: asyncio.Queue,
) -> None:
    """Every worker's messages, in the order each sent them, then ("exit", w, code) once
    its process has ended and its pipe is read to the end."""
    index = {id(r): w for w, r in enumerate(readers)}
    sentinels = {w.process.sentinel: i for i, w in enumerate(workers)}
    open_pipes, live = list(readers), dict(sentinels)
    ended: set[int] = set()
    gone: set[int] = set()

    def post(message: tuple) -> None:
        loop.call_soon_threadsafe(events.put_nowait, message)

    while open_pipes or live:
        for ready in wait([*open_pipes, *live]):
            if isinstance(ready, Connection):
                w = index[id(ready)]
                try:
                    post(ready.recv())
                    continue
                except Exception:  # EOF, or a message cut by the worker's death
                    open_pipes.remove(ready)
                    ready.close()
                    gone.add(w)
            else:
                w = live.pop(ready)
                ended.add(w)
            if w in gone and w in ended:
                # its sentinel closes as it exits, a moment before it can be reaped
                workers[w].process.join(STOP_WAIT_S)
                post(("exit", w, workers[w].process.exitcode))
