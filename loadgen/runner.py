"""Sends requests on schedule and records every one.

Open loop: the arrival offsets are computed up front and the dispatcher sleeps to absolute
times (t0 + offset), so lateness never accumulates; a concurrency cap makes late arrivals wait
for a slot, and that wait is `queue_s`, kept apart from the client's own lag. Closed loop:
C workers' worth of slots, each refilled the moment a request ends."""

from __future__ import annotations

import asyncio
import gc
import itertools
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from loadgen.backends import Backend
from loadgen.event_loop import sleep_until
from loadgen.load_plan import LoadPlan
from loadgen.records import RequestRecord
from loadgen.redact import printable
from loadgen.sessions import Session, next_turn
from loadgen.workload import RequestSpec

T = TypeVar("T")
FAIL_FAST = 10  # the first this many measured requests all failing alike stops the run


class ProbeFailed(RuntimeError):
    """The test request before the load failed: nothing was measured."""


@dataclass(slots=True)
class Progress:
    """Live counters for the progress bar (measured requests only)."""

    total: int | None = None
    sent: int = 0
    completed: int = 0
    failed: int = 0
    in_flight: int = 0
    warming_up: bool = False


@dataclass(slots=True, repr=False)  # asyncio.run reprs its result: keep that cheap
class RunOutcome:
    records: list[RequestRecord]  # measured requests, in the order they ended
    warmup: list[RequestRecord]
    elapsed_s: float  # from the first scheduled send to the last request's end
    interrupted: bool
    t0: float = 0.0  # perf_counter() at the first scheduled send: the records' zero
    stopped_early: str | None = None  # why the run stopped itself before its whole load

    def __repr__(self) -> str:
        return f"RunOutcome({len(self.records)} records, {self.elapsed_s:.2f} s)"


class LoadRunner:
    def __init__(
        self,
        backend: Backend,
        plan: LoadPlan,
        on_record: Callable[[RequestRecord], None] | None = None,
        run_id: str = "req",
        clock: Callable[[], float] = time.perf_counter,
        gate: Callable[[str], Awaitable[float]] | None = None,
    ) -> None:
        """clock: the records' time (a simulated engine's virtual clock, whose event loop
        jumps to each timer: no spin, it would never end). gate: awaited before the warm-up
        and before the load (a worker process's driver lets its workers on together); the
        load's returns t0, the start the driver gave every worker (loadgen/split_runner.py)."""
        self.backend, self.plan = backend, plan
        self.gate = gate
        self.clock = clock
        self.on_record = on_record
        self.run_id = run_id
        self.progress = Progress(total=plan.total)
        self.records: list[RequestRecord] = []
        self.warmup_records: list[RequestRecord] = []
        self.probe_record: RequestRecord | None = None  # the test request, not measured
        self._tasks: set[asyncio.Task] = set()
        self._dispatcher: asyncio.Task | None = None
        self._next_index = 0  # multi-turn: records are numbered as their turns are made
        self._unfinished: dict[str, RequestRecord] = {}  # made, not yet recorded
        self._stopped = False
        self.stop_signal: int | None = None
        self.stopped_early: str | None = None
        self._first_errors: set[str] = set()  # while nothing has succeeded yet
        self.t0 = 0.0
        self.next_send: float | None = None  # open loop: perf_counter() of the next send
        # where the run is: what an interrupted run's summary says it stopped in
        self.phase = "start-up"
        self._phase_task: asyncio.Task | None = None  # the test request, awaited alone

    def stop(self, signum: int | None = None) -> None:
        """Stop sending and cancel what is in flight (Ctrl-C); finished records are kept."""
        self._stopped = True
        self.stop_signal = self.stop_signal or signum
        for task in (self._dispatcher, self._phase_task):
            if task is not None:
                task.cancel()
        for task in list(self._tasks):
            task.cancel()

    async def run(self) -> RunOutcome:
        """Raises ProbeFailed, before any load, when the test request fails."""
        await self.backend.start()
        try:
            if self.plan.probe is not None and not self._stopped:
                self.phase = "test request"
                await self._phased(self._probe(self.plan.probe))
            if self.gate is not None and not self._stopped:
                await self._phased(self.gate("warm-up"))
            if self.plan.warmup and not self._stopped:
                self.phase = "warm-up"
                await self._warmup()
            # Everything built so far (prompts, schedule, warm-up state) lives to the end: move
            # it out of the collector's sight, so no full collection stalls a send mid-run.
            gc.collect()
            gc.freeze()
            self.t0 = self.clock()
            if self.gate is not None and not self._stopped:
                self.t0 = await self._phased(self.gate("load")) or self.t0
            if not self._stopped:
                self.phase = "load"
                dispatch = self._open_loop() if self.plan.offsets is not None else self._closed()
                self._dispatcher = asyncio.create_task(dispatch)
                try:
                    await self._dispatcher
                except asyncio.CancelledError:
                    if not self._stopped:
                        raise
                if not self._stopped:  # everything sent: waiting for the last replies
                    self.phase = "drain"
            await asyncio.gather(*self._tasks, return_exceptions=True)
            elapsed = self.clock() - self.t0
        finally:  # on any error too: nothing left running, every record made is recorded
            for task in list(self._tasks):
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
            for rec in list(self._unfinished.values()):  # tasks cancelled before they ran
                rec.status, rec.error = "cancelled", "the run stopped before it was sent"
                self._finish(rec)
            gc.unfreeze()
            await self.backend.close()
        interrupted = self._stopped and self.stopped_early is None
        return RunOutcome(
            self.records, self.warmup_records, elapsed, interrupted, self.t0, self.stopped_early
        )

    async def _phased(self, step: Awaitable[T]) -> T | None:
        """A step before the load, as a task of its own, so a signal cancels it instead of
        waiting it out (a test request's --timeout); None when stopped."""
        self._phase_task = asyncio.ensure_future(step)
        try:
            return await self._phase_task
        except asyncio.CancelledError:
            if not self._stopped:
                raise
            return None
        finally:
            self._phase_task = None

    async def _probe(self, spec: RequestSpec) -> None:
        """One request alone, not measured: a wrong URL, model or key fails here, with the
        server's own message, instead of as every request of the run."""
        rid = f"{self.run_id}-probe"
        rec = RequestRecord(-1, rid, spec.input_len, spec.output_len, True, cls=spec.cls, n=spec.n)
        self.probe_record = rec
        try:
            await self.backend.send(spec, rec, self.clock())
        except asyncio.CancelledError:
            rec.status, rec.error = "cancelled", "the run stopped during the test request"
            raise
        except Exception as e:  # as _send: a backend's bug is this request's failure
            rec.status, rec.error = "error", f"{type(e).__name__}: {e}"
        if not rec.ok:
            where = getattr(self.backend, "shown_url", self.backend.name)
            status = f" (HTTP {rec.http_status})" if rec.http_status else ""
            error = printable(rec.error)  # for the terminal: the record keeps the raw text
            raise ProbeFailed(f"the test request to {where} failed{status}: {error}")

    async def _warmup(self) -> None:
        """Warm-up requests, before the clock starts, at most `concurrency` at a time."""
        self.progress.warming_up = True
        sem = asyncio.Semaphore(self.plan.concurrency or len(self.plan.warmup))
        t0 = self.clock()

        async def one(i: int, spec: RequestSpec) -> None:
            rec = self._record(i, spec, warmup=True)
            async with sem:
                rec.scheduled_s = self.clock() - t0
                await self._send(spec, rec, t0)

        tasks = [asyncio.create_task(one(i, s)) for i, s in enumerate(self.plan.warmup)]
        self._tasks.update(tasks)
        await asyncio.gather(*tasks, return_exceptions=True)
        self._tasks.difference_update(tasks)
        self.progress.warming_up = False

    async def _open_loop(self) -> None:
        assert self.plan.offsets is not None
        cap = asyncio.Semaphore(self.plan.concurrency) if self.plan.concurrency else None
        for i, (offset, spec) in enumerate(zip(self.plan.offsets, self.plan.specs, strict=False)):
            self.next_send = self.t0 + offset
            if self.clock is time.perf_counter:
                await sleep_until(self.next_send)
            else:
                await asyncio.sleep(self.next_send - self.clock())
            if isinstance(spec, Session):
                self._launch(self._session(i, spec, offset, cap), requests=0)
            else:
                rec = self._record(i, spec)
                rec.scheduled_s = offset
                self._launch(self._capped(spec, rec, cap))
            if self.clock is time.perf_counter:
                # Let it leave before next_send moves on: a live view that finds the next send
                # far off draws at once, and drawing in front of a task not yet run delayed
                # its send by the redraw (10-30 ms in a terminal beside the engine). Virtual
                # time needs no yield (and a simulation's order stays as it was).
                await asyncio.sleep(0)

    async def _capped(
        self, spec: RequestSpec, rec: RequestRecord, cap: asyncio.Semaphore | None
    ) -> None:
        if cap is None:
            await self._send(spec, rec, self.t0)
            return
        arrived = self.clock()
        try:
            await cap.acquire()
        except asyncio.CancelledError:
            rec.status, rec.error = "cancelled", "stopped while waiting for a slot"
            self._finish(rec)
            raise
        try:
            rec.queue_s = self.clock() - arrived
            await self._send(spec, rec, self.t0)
        finally:
            cap.release()

    async def _closed(self) -> None:
        plan = self.plan
        assert plan.concurrency is not None
        slots = asyncio.Semaphore(plan.concurrency)
        for i in itertools.count():
            if plan.num_requests is not None and i >= plan.num_requests:
                return
            await slots.acquire()
            spec = None if self._past(plan.duration_s) else await self._take()
            if spec is None or self._past(plan.duration_s):  # taking may have waited
                slots.release()
                return
            now = self.clock() - self.t0
            if isinstance(spec, Session):  # the slot is the conversation's, turn after turn
                self._launch(self._session(i, spec, now, None, release=slots), requests=0)
                continue
            rec = self._record(i, spec)
            rec.scheduled_s = now  # a closed loop sends the moment a slot frees up
            self._launch(self._send(spec, rec, self.t0, release=slots))

    def _past(self, duration_s: float | None) -> bool:
        return duration_s is not None and self.clock() - self.t0 >= duration_s

    async def _take(self) -> RequestSpec | Session | None:
        """A closed loop's next request (a worker process asks its driver: worker_feed.py)."""
        return next(self.plan.specs, None)

    async def _session(
        self,
        i: int,
        session: Session,
        due: float,
        cap: asyncio.Semaphore | None,
        release: asyncio.Semaphore | None = None,
    ) -> None:
        """One conversation: each turn goes `think_s` after the previous reply ended, with
        every earlier prompt and reply as its context; a failed turn ends the conversation."""
        history: tuple[tuple[str, str], ...] = ()
        context = 0
        try:
            for k, turn in enumerate(session.turns):
                spec = next_turn(turn, history, context)
                rec = self._record(self._next_index, spec)
                self._next_index += 1
                rec.session, rec.turn, rec.scheduled_s = i, k, due
                if k:  # the first turn goes now; think time needs no sub-ms spin
                    await asyncio.sleep(max(0.0, self.t0 + due - self.clock()))
                self.progress.sent += 1
                await self._capped(spec, rec, cap)
                if not rec.ok or self._stopped:
                    return
                history += (("user", turn.prompt), ("assistant", rec.reply))
                context = spec.input_len + rec.output_tokens
                due = self.clock() - self.t0 + session.think_s
        finally:
            if release is not None:
                release.release()

    def _record(self, i: int, spec: RequestSpec, warmup: bool = False) -> RequestRecord:
        rid = f"{self.run_id}-{'w' if warmup else ''}{i}"
        rec = RequestRecord(
            i, rid, spec.input_len, spec.output_len, warmup=warmup, cls=spec.cls, n=spec.n
        )
        self._unfinished[rid] = rec
        return rec

    def _launch(self, coro, requests: int = 1) -> None:
        """`requests`: how many this task sends now (a conversation counts its turns as sent)."""
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        self.progress.sent += requests

    async def _send(
        self,
        spec: RequestSpec,
        rec: RequestRecord,
        t0: float,
        release: asyncio.Semaphore | None = None,
    ) -> None:
        self.progress.in_flight += not rec.warmup
        try:
            await self.backend.send(spec, rec, t0)
        except asyncio.CancelledError:
            rec.status = "cancelled"
            raise
        except Exception as e:  # a backend bug must not take the run down: record it
            rec.status, rec.error = "error", f"{type(e).__name__}: {e}"
        finally:
            self.progress.in_flight -= not rec.warmup
            if release is not None:
                release.release()
            self._finish(rec)

    def _finish(self, rec: RequestRecord) -> None:
        if self._unfinished.pop(rec.request_id, None) is None:
            return  # already recorded
        if rec.status == "pending":
            rec.status = "error"
        counted = rec.prompt_tokens_source != "tokenizer" and rec.prompt_tokens is not None
        if counted and rec.turn is None:  # a later turn's input_len is not its whole context
            rec.prompt_tokens_added = rec.prompt_tokens - rec.input_len  # type: ignore[operator]
        (self.warmup_records if rec.warmup else self.records).append(rec)
        if not rec.warmup:
            self.progress.completed += rec.ok
            self.progress.failed += not rec.ok
        if self.on_record is not None:
            self.on_record(rec)
        if not rec.warmup and rec.status == "error":
            self._fail_fast(rec)

    def _fail_fast(self, rec: RequestRecord) -> None:
        """Stop when the first FAIL_FAST measured requests all failed the same way (the server
        went away, or refuses them all): the rest would fail too, and take as long."""
        if self.progress.completed or self._stopped or self.progress.failed > FAIL_FAST:
            return
        self._first_errors.add(re.sub(r"\d+", "N", rec.error or ""))
        more_to_send = self.plan.total is None or self.plan.total > FAIL_FAST
        if self.progress.failed == FAIL_FAST and len(self._first_errors) == 1 and more_to_send:
            self.stopped_early = (
                f"the first {FAIL_FAST} requests all failed alike ({rec.error}); "
                "stopped before sending the rest"
            )
            self.stop()
