"""How fast can the load generator send? Against a server that answers at once (32 streamed
chunks per request), find the highest Poisson rate at which the achieved send rate stays
within 1% of the schedule's and the p99 scheduling lag under 5 ms, with the load generator
pinned to one core and the server to another. Records are written to a requests.jsonl as in
a real run, so the cost of keeping them is counted.

With --workers N the schedule is sent from N worker processes (`bench run --workers N`), the
driver merging their records; the server keeps its core and the client (driver and workers)
gets every other core of the machine, shared when there are fewer than N.

    python benchmarks/loadgen_capacity.py [--seconds 4] [--start 250] [--workers N]
        [--server instant]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from child_procs import group_child

from loadgen.arrivals import Arrivals, take_schedule
from loadgen.backends import OpenAIBackend
from loadgen.event_loop import run_event_loop
from loadgen.load_plan import LoadPlan
from loadgen.metrics import summarize
from loadgen.records import RecordWriter
from loadgen.runner import LoadRunner
from loadgen.split_runner import SplitRunner
from loadgen.workload import RequestSpec

MAX_RATE_ERROR, MAX_P99_LAG_S = 0.01, 0.005


@contextlib.contextmanager
def mock_server(port: int, core: int | None, kind: str = "mock") -> Iterator[subprocess.Popen]:
    """The instant server, pinned to its core, stopped however the benchmark ends: `mock`,
    loadgen.mock_server answering at once, or `instant`, benchmarks/instant_server.py (the
    same responses on a bare asyncio protocol, cheaper per request)."""
    cmd = [sys.executable, "-m", "loadgen.mock_server", "--port", str(port)]
    cmd += ["--ttft", "0", "--itl", "0"]
    if kind == "instant":
        cmd = [sys.executable, str(Path(__file__).with_name("instant_server.py"))]
        cmd += ["--port", str(port)]
    pin = (lambda: os.sched_setaffinity(0, {core})) if core is not None else None
    with group_child(cmd, preexec_fn=pin, stderr=subprocess.DEVNULL) as proc:
        for _ in range(100):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1).close()
                break
            except OSError:
                time.sleep(0.1)
        else:
            raise RuntimeError("mock server did not start")
        yield proc


async def _with_dashboard(runner: LoadRunner | SplitRunner, rate: float) -> Any:
    """The live dashboard redrawing as in `bench run`, onto a terminal that is /dev/null."""
    from rich.console import Console

    from bench_cli.dashboard import Dashboard

    console = Console(file=open(os.devnull, "w"), force_terminal=True, width=120)  # noqa: SIM115
    view = asyncio.create_task(Dashboard(runner, None, "capacity", rate, console).run())
    try:
        return await runner.run()
    finally:
        view.cancel()


def measure(
    url: str,
    rate: float,
    seconds: float,
    chunks: int,
    tmp: Path,
    dashboard: bool = False,
    workers: int = 1,
) -> dict:
    arrivals = Arrivals("poisson", rate=rate, seed=int(rate))
    offsets = take_schedule(arrivals.offsets(), None, seconds)
    specs = iter([RequestSpec("x " * 16, 16, chunks)] * len(offsets))
    writer = RecordWriter(tmp / f"requests-{rate:g}.jsonl")
    backend = OpenAIBackend(url, "mock", max_connections=0, timeout_s=60)
    # Warm-up requests open the connection pool first, as --warmup does in a real run.
    warmup = [RequestSpec("x " * 16, 16, chunks)] * 256
    plan = LoadPlan(specs, offsets, warmup=warmup)
    if workers > 1:
        runner: Any = SplitRunner(backend, plan, workers, writer.write)
    else:
        runner = LoadRunner(backend, plan, writer.write)
    outcome = run_event_loop(_with_dashboard(runner, rate) if dashboard else runner.run())
    writer.close()
    s = summarize(outcome.records, outcome.elapsed_s, arrivals)
    if getattr(runner, "failure", None):
        raise RuntimeError(runner.failure)
    check = s["arrival_check"]
    achieved, scheduled = check["achieved_rate"], check["scheduled_rate"]
    p99 = s["schedule_lag_s"]["p99"]
    if workers > 1:  # a worker behind its own schedule is a miss even when the merged p99 is not
        from loadgen.per_worker import worker_table

        p99 = max([p99, *(w["schedule_lag_s"]["p99"] for w in worker_table(outcome.records, 1))])
    ok = (
        abs(achieved / scheduled - 1) <= MAX_RATE_ERROR
        and p99 <= MAX_P99_LAG_S
        and s["failed"] == 0
    )
    return {
        "rate": rate,
        "achieved": achieved,
        "scheduled": scheduled,
        "p99_lag_ms": p99 * 1e3,
        "completed": s["completed"],
        "failed": s["failed"],
        "ok": ok,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=4.0, help="length of each trial")
    p.add_argument("--start", type=float, default=250.0, help="first rate (doubles until a miss)")
    p.add_argument("--chunks", type=int, default=32)
    p.add_argument("--port", type=int, default=8199)
    p.add_argument("--dashboard", action="store_true", help="with the live dashboard redrawing")
    p.add_argument("--workers", type=int, default=1, help="worker processes sending the load")
    p.add_argument("--server", choices=["mock", "instant"], default="mock", help="which server")
    a = p.parse_args()
    cores = sorted(os.sched_getaffinity(0))
    server_core = cores[-1] if len(cores) > 1 else None
    client_cores = [c for c in cores if c != server_core]
    if a.workers == 1:
        client_cores = client_cores[:1]
    with mock_server(a.port, server_core, a.server):
        os.sched_setaffinity(0, set(client_cores))  # the workers inherit it
        url = f"http://127.0.0.1:{a.port}/v1"
        print(
            f"client ({a.workers} worker process{'es' if a.workers > 1 else ''}) on cores "
            f"{client_cores}, server on core {server_core}, {a.chunks} chunks/request"
        )
        print(
            f"{'target':>8} {'scheduled':>10} {'achieved':>9} {'p99 lag ms':>11} {'failed':>7}  ok"
        )
        results = []
        with tempfile.TemporaryDirectory() as tmp:

            def trial(rate: float) -> dict:
                r = measure(url, rate, a.seconds, a.chunks, Path(tmp), a.dashboard, a.workers)
                print(
                    f"{r['rate']:8.0f} {r['scheduled']:10.1f} {r['achieved']:9.1f} "
                    f"{r['p99_lag_ms']:11.2f} {r['failed']:7d}  {'yes' if r['ok'] else 'no'}"
                )
                results.append(r)
                return r

            rate = a.start
            while trial(rate)["ok"]:
                rate *= 2
            lo, hi = rate / 2, rate
            for _ in range(4):  # bisect between the last pass and the first miss
                mid = (lo + hi) / 2
                lo, hi = (mid, hi) if trial(mid)["ok"] else (lo, mid)
    best = max((r for r in results if r["ok"]), key=lambda r: r["rate"], default=None)
    if best is None:
        print(f"capacity: below {a.start:g} req/s")
    else:
        print(
            f"capacity: {best['rate']:.0f} req/s ({a.chunks} chunks each) with p99 lag "
            f"{best['p99_lag_ms']:.2f} ms and the achieved rate within "
            f"{abs(best['achieved'] / best['scheduled'] - 1) * 100:.2f}% of the schedule's"
        )


if __name__ == "__main__":
    main()
