"""The engine loop on its own thread, so the event loop stays responsive while a step
computes; each request gets an async stream of outputs.

Only the engine thread touches the `LLMEngine`: new requests (validated on the event loop
with `make_request`) and aborts reach it through a locked inbox drained before every step."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import Any

from engine import omp_wait
from engine.core.request import Request, RequestOutput, SamplingParams
from engine.engine import LLMEngine
from engine.serving.metrics import Histogram

log = logging.getLogger(__name__)


class EngineStepError(RuntimeError):
    pass


class AsyncLLMEngine:
    def __init__(self, engine: LLMEngine) -> None:
        self.engine = engine
        self._inbox_lock = threading.Lock()
        self._new: list[Request] = []
        # Sequences accepted and not yet in the engine's stats (the inbox, and what the engine
        # thread has taken from it before its next stats snapshot): one per child of n > 1.
        self._unlisted_seqs = 0
        self._aborts: list[str] = []
        self._wake = threading.Event()
        self._streams: dict[str, asyncio.Queue[RequestOutput | Exception]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._stopping = False
        self.stats: dict[str, Any] = engine.stats()  # refreshed by the engine thread
        self.step_time_s = Histogram()

    @property
    def num_in_flight(self) -> int:
        return len(self._streams)

    @property
    def num_not_running(self) -> int:
        """Sequences (n > 1: each child) accepted and not in the running batch: waiting in
        the engine, held back for a sibling's prefill, or not yet handed to the engine thread.
        What admission control (--max-queue) counts; /metrics reports the engine's own
        `num_waiting`, as the step log and stats do. Read with the snapshot it adds to, so a
        request is counted once while it moves from the inbox into the engine."""
        with self._inbox_lock:
            return int(self.stats["num_waiting"]) + self._unlisted_seqs

    async def start(self) -> None:
        # This thread built and warmed the engine; the engine thread is to hold the only
        # OpenMP pool, or every parallel region of a step sleeps and wakes (omp_wait.py).
        omp_wait.release_thread_pool()
        self._loop = asyncio.get_running_loop()
        self._thread = threading.Thread(target=self._run, name="engine-loop", daemon=True)
        self._thread.start()

    async def stop(self) -> None:
        """Stop the engine thread; every request still in flight ends with "abort"."""
        self._stopping = True
        self._wake.set()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join)
        self.engine.shutdown()  # tensor-parallel workers, once no step can run

    def generate(
        self,
        request_id: str,
        prompt: str | list[int],
        params: SamplingParams,
        priority: int = 0,
    ) -> RequestStream:
        """Validate now (ValueError for a bad request), then stream the request's outputs
        (with n > 1, each completion's, told apart by `outputs[0].index`; the last one is
        `finished`). Closing the stream before the end (a client gone) aborts the request."""
        if request_id in self._streams:
            raise ValueError(f"request id {request_id!r} is already in use")
        req = self.engine.make_request(request_id, prompt, params, priority=priority)
        queue: asyncio.Queue[RequestOutput | Exception] = asyncio.Queue()
        self._streams[request_id] = queue
        with self._inbox_lock:
            self._new.append(req)
            self._unlisted_seqs += req.params.n
        self._wake.set()
        return RequestStream(self, request_id, queue)

    def release(self, request_id: str, abort: bool) -> None:
        self._streams.pop(request_id, None)
        if abort:
            self.abort(request_id)

    def abort(self, request_id: str) -> None:
        with self._inbox_lock:
            self._aborts.append(request_id)
        self._wake.set()

    # ---- engine thread -----------------------------------------------------------------

    def _run(self) -> None:
        engine = self.engine
        while not self._stopping:
            outputs = self._take_inbox()
            if engine.has_unfinished_requests():
                t0 = time.perf_counter()
                try:
                    outputs += engine.step()
                except Exception as e:  # fail this step's requests, keep serving the rest
                    log.exception("engine step failed")
                    outputs += engine.fail_running(f"engine step failed: {type(e).__name__}: {e}")
                self.step_time_s.observe(time.perf_counter() - t0)
            else:
                self._wake.wait(timeout=0.5)
                self._wake.clear()
            self.stats = engine.stats()
            self._send(outputs)
        outputs = self._take_inbox()
        parents = {r.parent_id for r in engine.requests.values()}  # n > 1: children's parents
        outputs += [o for r in parents if (o := engine.abort_request(r))]
        self.stats = engine.stats()
        self._send(outputs)

    def _take_inbox(self) -> list[RequestOutput]:
        """Add new requests and apply aborts; returns the aborted requests' last outputs."""
        with self._inbox_lock:
            new, self._new = self._new, []
            aborts, self._aborts = self._aborts, []
        dropped = set(aborts)  # a client that left before its request was even added
        failed = []
        for req in new:
            if req.request_id in dropped:
                continue
            try:
                self.engine.add(req)
            except Exception as e:  # the engine thread must outlive any one request
                log.exception("could not add request %s", req.request_id)
                req.error = f"the engine could not take the request: {type(e).__name__}: {e}"
                failed.append(RequestOutput.of(req, []))
        outputs = failed + [o for r in aborts if (o := self.engine.abort_request(r))]
        if new:  # now in the engine's counts: publish them and stop counting them here
            stats = self.engine.stats()
            with self._inbox_lock:
                self.stats = stats
                self._unlisted_seqs -= sum(r.params.n for r in new)
        return outputs

    def _send(self, outputs: list[RequestOutput]) -> None:
        if outputs:
            assert self._loop is not None
            self._loop.call_soon_threadsafe(self._deliver, outputs)

    def _deliver(self, outputs: list[RequestOutput]) -> None:
        for out in outputs:
            queue = self._streams.get(out.request_id)
            if queue is None:
                continue  # the client left; its abort is on the way
            if out.error is not None:
                queue.put_nowait(EngineStepError(out.error))
            else:
                queue.put_nowait(out)


class RequestStream:
    """One request's outputs as an async iterator. Unlike an async generator, `aclose()`
    cleans up even if iteration never started, so no request is ever left orphaned."""

    def __init__(self, engine: AsyncLLMEngine, request_id: str, queue: asyncio.Queue) -> None:
        self.engine = engine
        self.request_id = request_id
        self._queue = queue
        self._done = False

    def __aiter__(self) -> RequestStream:
        return self

    async def __anext__(self) -> RequestOutput:
        if self._done:
            raise StopAsyncIteration
        try:
            item = await self._queue.get()
        except BaseException:  # cancelled while waiting: the consumer is gone
            await self.aclose()
            raise
        if isinstance(item, Exception):  # the engine already ended the request
            self._done = True
            self.engine.release(self.request_id, abort=False)
            raise item
        if item.finished:
            self._done = True
            self.engine.release(self.request_id, abort=False)
        return item

    async def aclose(self) -> None:
        if not self._done:
            self._done = True
            self.engine.release(self.request_id, abort=True)
