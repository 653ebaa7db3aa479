"""How fast can the load generator send? Against a server that answers at once (32 streamed
chunks per request), find the highest Poisson rate at which the achieved send rate stays
within 1% of the schedule's and the p99 scheduling lag under 5 ms, with the load generator
pinned to one core and the server to another. Records are written to a requests.jsonl as in
a real run, so the cost of keeping them is counted.

    python benchmarks/loadgen_capacity.py [--seconds 4] [--start 250]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from loadgen.arrivals import Arrivals, take_schedule
from loadgen.backends import OpenAIBackend
from loadgen.metrics import summarize
from loadgen.records import RecordWriter
from loadgen.runner import LoadPlan, LoadRunner, run_event_loop
from loadgen.workload import RequestSpec

MAX_RATE_ERROR, MAX_P99_LAG_S = 0.01, 0.005


def start_server(port: int, core: int | None) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "loadgen.mock_server", "--port", str(port)]
    cmd += ["--ttft", "0", "--itl", "0"]
    pin = (lambda: os.sched_setaffinity(0, {core})) if core is not None else None
    proc = subprocess.Popen(cmd, preexec_fn=pin, stderr=subprocess.DEVNULL)
    for _ in range(100):
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1).close()
            return proc
        except OSError:
            time.sleep(0.1)
    raise RuntimeError("mock server did not start")


async def _with_dashboard(runner: LoadRunner, rate: float) -> Any:
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
    url: str, rate: float, seconds: float, chunks: int, tmp: Path, dashboard: bool = False
) -> dict:
    arrivals = Arrivals("poisson", rate=rate, seed=int(rate))
    offsets = take_schedule(arrivals.offsets(), None, seconds)
    specs = iter([RequestSpec("x " * 16, 16, chunks)] * len(offsets))
    writer = RecordWriter(tmp / f"requests-{rate:g}.jsonl")
    backend = OpenAIBackend(url, "mock", max_connections=0, timeout_s=60)
    # Warm-up requests open the connection pool first, as --warmup does in a real run.
    warmup = [RequestSpec("x " * 16, 16, chunks)] * 256
    runner = LoadRunner(backend, LoadPlan(specs, offsets, warmup=warmup), writer.write)
    outcome = run_event_loop(_with_dashboard(runner, rate) if dashboard else runner.run())
    writer.close()
    s = summarize(outcome.records, outcome.elapsed_s, arrivals)
    check = s["arrival_check"]
    achieved, scheduled = check["achieved_rate"], check["scheduled_rate"]
    p99 = s["schedule_lag_s"]["p99"]
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
    a = p.parse_args()
    cores = sorted(os.sched_getaffinity(0))
    client_core, server_core = (cores[0], cores[1]) if len(cores) > 1 else (cores[0], None)
    server = start_server(a.port, server_core)
    os.sched_setaffinity(0, {client_core})
    url = f"http://127.0.0.1:{a.port}/v1"
    print(f"client on core {client_core}, server on core {server_core}, {a.chunks} chunks/request")
    print(f"{'target':>8} {'scheduled':>10} {'achieved':>9} {'p99 lag ms':>11} {'failed':>7}  ok")
    results = []
    try:
        with tempfile.TemporaryDirectory() as tmp:

            def trial(rate: float) -> dict:
                r = measure(url, rate, a.seconds, a.chunks, Path(tmp), a.dashboard)
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
    finally:
        server.terminate()
        server.wait()
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
