"""`bench run --ray-address ADDR|local`: the workers of `--workers N` as Ray actors placed
across a cluster's nodes (one CPU each, placement spread), running the same worker body as
a local process (loadgen/workers.py's run_worker): only the transport differs, queues behind
the actor's methods instead of pipes. The driver (SplitRunner) leads and merges as it does
for processes.

Latencies are durations on one worker's clock and need no sync. Timelines do: each worker's
perf_counter is measured against the driver's at start (the round trip with the least delay
of several: offset = remote - midpoint, uncertainty = half that round trip), and each worker
is told the run's t0 on its own clock, so its records land on the driver's zero to within
that uncertainty (summary.json's `clock_offsets`)."""

from __future__ import annotations

import asyncio
import os
import queue
import socket
import threading
import time
import urllib.parse
from dataclasses import dataclass
from typing import Any

from loadgen.split_runner import SplitRunner, WorkerState
from loadgen.workers import WorkerJob, run_worker

CLOCK_SAMPLES = 8  # round trips per worker; the quickest one gives the offset
PLACE_TIMEOUT_S = 60.0  # the cluster has this long to find a CPU for every worker
POLL_S = 0.05


def import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise ValueError(
            "--ray-address needs Ray: pip install 'servebench[ray]' (on every node)"
        ) from None
    return ray


def connect(address: str) -> Any:
    """`local` starts (or reuses) a Ray instance on this machine; else joins ADDR."""
    ray = import_ray()
    if not ray.is_initialized():
        ray.init(address=None if address == "local" else address, log_to_driver=False)
    return ray


class _Inbox:
    """The actor side's Connection stand-in: recv() blocks for the driver's next command."""

    def __init__(self) -> None:
        self.queue: queue.SimpleQueue[tuple] = queue.SimpleQueue()

    def recv(self) -> tuple:
        return self.queue.get()


class _Outbox:
    """send() queues a message for the driver's next poll."""

    def __init__(self) -> None:
        self.queue: queue.SimpleQueue[tuple] = queue.SimpleQueue()

    def send(self, message: tuple) -> None:
        self.queue.put(message)


class WorkerActor:
    """One worker on a Ray node: run_worker in a thread, its messages polled by the driver."""

    def __init__(self) -> None:
        self._inbox, self._outbox = _Inbox(), _Outbox()
        self._thread: threading.Thread | None = None
        self._ok: bool | None = None

    def where(self) -> tuple[str, int]:
        return socket.gethostname(), os.getpid()

    def clock(self) -> float:
        return time.perf_counter()

    def start(self, job: WorkerJob) -> None:
        def body() -> None:
            self._ok = run_worker(job, self._inbox, self._outbox)
            self._outbox.send(("exit", job.worker, 0 if self._ok else 1))

        self._thread = threading.Thread(target=body, daemon=True)
        self._thread.start()

    def tell(self, message: tuple) -> None:
        self._inbox.queue.put(message)

    def poll(self, timeout_s: float) -> list[tuple]:
        """Every message waiting, after at most timeout_s for the first."""
        out = []
        try:
            out.append(self._outbox.queue.get(timeout=timeout_s))
            while True:
                out.append(self._outbox.queue.get_nowait())
        except queue.Empty:
            return out


@dataclass(slots=True)
class ClockOffset:
    worker: int
    node: str
    pid: int
    offset_s: float  # the worker's perf_counter minus the driver's
    uncertainty_s: float  # half the quickest round trip: the offset is within +-this


def measure_offset(ray: Any, actor: Any, worker: int, samples: int = CLOCK_SAMPLES) -> ClockOffset:
    node, pid = ray.get(actor.where.remote())
    trips = []
    for _ in range(samples):
        t1 = time.perf_counter()
        remote = ray.get(actor.clock.remote())
        trips.append((time.perf_counter() - t1, t1, remote))
    trip, t1, remote = min(trips)
    return ClockOffset(worker, node, pid, remote - (t1 + trip / 2), trip / 2)


class _ActorHandle:
    """What SplitRunner asks of a worker's process and command pipe, for an actor."""

    def __init__(self, ray: Any, actor: Any, pid: int) -> None:
        self.ray, self.actor, self.pid = ray, actor, pid

    def send(self, message: tuple) -> None:
        self.actor.tell.remote(message)

    def kill(self) -> None:
        self.ray.kill(self.actor)

    def join(self, timeout: float | None = None) -> None:
        pass

    def close(self) -> None:
        pass


class RaySplitRunner(SplitRunner):
    """SplitRunner with its workers on Ray actors instead of local processes."""

    def __init__(self, *args: Any, address: str = "local") -> None:
        super().__init__(*args)
        self.address = address
        self.clock_offsets: list[ClockOffset] = []
        self._group: Any = None

    async def _start_workers(
        self, loop: asyncio.AbstractEventLoop, events: asyncio.Queue
    ) -> threading.Thread:
        return await asyncio.to_thread(self._place, loop, events)

    def _place(self, loop: asyncio.AbstractEventLoop, events: asyncio.Queue) -> threading.Thread:
        ray = connect(self.address)
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        self._group = placement_group([{"CPU": 1}] * self.n, strategy="SPREAD")
        ready, _ = ray.wait([self._group.ready()], timeout=PLACE_TIMEOUT_S)
        if not ready:
            ray.util.remove_placement_group(self._group)
            raise RuntimeError(
                f"Ray could not place {self.n} workers of one CPU each within "
                f"{PLACE_TIMEOUT_S:g} s: the cluster has {ray.cluster_resources().get('CPU', 0):g}"
                " CPUs (ray status shows what is free)"
            )
        remote = ray.remote(num_cpus=1, max_concurrency=4)(WorkerActor)
        actors = []
        for w in range(self.n):
            strategy = PlacementGroupSchedulingStrategy(self._group, placement_group_bundle_index=w)
            actors.append(remote.options(scheduling_strategy=strategy).remote())
        self.clock_offsets = [measure_offset(ray, actor, w) for w, actor in enumerate(actors)]
        try:
            self._check_reachable()
        except RuntimeError:
            ray.util.remove_placement_group(self._group)
            for actor in actors:
                ray.kill(actor)
            raise
        for actor, job, offset in zip(actors, self.jobs(), self.clock_offsets, strict=True):
            handle = _ActorHandle(ray, actor, offset.pid)
            self._workers.append(WorkerState(handle, handle, clock_offset_s=offset.offset_s))
            ray.get(actor.start.remote(job))
        thread = threading.Thread(target=self._read_all, args=(ray, actors, loop, events))
        thread.start()
        return thread

    def _check_reachable(self) -> None:
        """A server on this machine's loopback is out of reach of workers on other hosts: say
        so before the load starts, not as every request failing."""
        host = urllib.parse.urlsplit(getattr(self.backend, "url", "") or "").hostname or ""
        away = sorted({c.node for c in self.clock_offsets} - {socket.gethostname()})
        if away and (host == "localhost" or host.startswith("127.") or host == "::1"):
            raise RuntimeError(
                f"the server is at {host}, this machine's loopback, but Ray placed workers on "
                f"{', '.join(away)}: give the server an address the cluster can reach"
            )

    def _read_all(
        self, ray: Any, actors: list[Any], loop: asyncio.AbstractEventLoop, events: asyncio.Queue
    ) -> None:
        """Each actor polled in turn until its worker has exited (or the actor died)."""

        def post(message: tuple) -> None:
            loop.call_soon_threadsafe(events.put_nowait, message)

        live = dict(enumerate(actors))
        while live:
            polls = {w: actor.poll.remote(POLL_S) for w, actor in live.items()}
            for w, ref in polls.items():
                try:
                    messages = ray.get(ref)
                except Exception as e:  # the actor (or its node) is gone
                    post(("error", w, f"Ray actor died: {type(e).__name__}: {e}"))
                    post(("exit", w, 1))
                    del live[w]
                    continue
                for message in messages:
                    post(message)
                    if message[0] == "exit":
                        del live[w]
        if self._group is not None:
            ray.util.remove_placement_group(self._group)
        for actor in actors:
            ray.kill(actor)

    def describe(self, summary: dict[str, Any]) -> None:
        super().describe(summary)
        summary["ray_address"] = self.address
        summary["clock_offsets"] = [
            {
                "worker": c.worker,
                "node": c.node,
                "pid": c.pid,
                "offset_s": c.offset_s,
                "uncertainty_s": c.uncertainty_s,
            }
            for c in self.clock_offsets
        ]
