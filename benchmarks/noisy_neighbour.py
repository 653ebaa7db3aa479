"""The engine's generate quiet and beside other processes: what a neighbour costs it.

    python benchmarks/noisy_neighbour.py                          # B=8, float32 and bf16 where fast
    python benchmarks/noisy_neighbour.py --batch 1 --rounds 5 --output-len 32
    python benchmarks/noisy_neighbour.py --variant spin=GOMP_SPINCOUNT=300000   # compare a policy
    python benchmarks/noisy_neighbour.py --vllm-python .venv-vllm/bin/python  # adds vLLM

Each system under test (our engine in each dtype that runs fast here, each `--variant` of its
environment, and vLLM where its interpreter imports `vllm`) is one long-lived child process:
it loads and warms once, then runs one `generate` of B sequences (`--context` random prompt
tokens, `--output-len` generated, greedy, EOS ignored) each time it is told to. Conditions:

- quiet: nothing of ours beside it (other users of the machine may still run: each round
  prints the load average, and the summary the spread of the quiet rounds);
- torch2: a process running 2-thread float32 matmuls in a loop (a test suite, a trainer);
- half: a process busy for 5 ms then asleep for 5 ms, i.e. half a core (a load generator).

Rounds alternate the conditions' order (and the systems' order within each), so a machine
whose own load drifts slows them alike. Each round prints each system's seconds; then the
medians and the slowdown (median under a neighbour / median quiet) side by side. The
neighbours are separate processes in their own process groups, stopped on every exit path.

vLLM (optional, `--vllm-python`): benchmarks/vllm_side_by_side.py's set-up (Intel OpenMP
preloaded, every core for its worker); the model is exported to a Hugging Face folder."""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
NEIGHBOURS = {
    "torch2": (
        "import torch\ntorch.set_num_threads(2)\na = torch.randn(768, 768)\nprint('ready', "
        "flush=True)\nwhile True:\n    a = torch.tanh(a @ a) * 0.5\n"
    ),
    "half": (
        "import time\nprint('ready', flush=True)\nwhile True:\n    end = time.perf_counter() + "
        "0.005\n    while time.perf_counter() < end:\n        pass\n    time.sleep(0.005)\n"
    ),
}
CONDITIONS = ("quiet", *NEIGHBOURS)


# ---- a child: one system under test -------------------------------------------------------


def child(spec_file: str) -> None:
    """Load, warm up, print 'ready'; then one generate per line on stdin, its result as JSON."""
    spec = json.loads(Path(spec_file).read_text())
    rng = __import__("random").Random(0)
    prompts = [
        [rng.randrange(1000, 40000) for _ in range(spec["context"])] for _ in range(spec["batch"])
    ]
    if spec["system"] == "vllm":
        sys.path.insert(0, str(HERE))
        from child_procs import stop_group_on_sigterm

        stop_group_on_sigterm()
        from vllm import LLM, SamplingParams

        llm = LLM(model=spec["model_dir"], dtype=spec["dtype"], max_num_seqs=spec["batch"],
                  max_model_len=spec["context"] + spec["output_len"], seed=0,
                  skip_tokenizer_init=True)  # fmt: skip
        inputs = [{"prompt_token_ids": p} for p in prompts]
        params = SamplingParams(max_tokens=spec["output_len"], temperature=0.0, ignore_eos=True,
                                detokenize=False)  # fmt: skip

        def generate() -> list[int]:
            return list(llm.generate(inputs, params, use_tqdm=False)[0].outputs[0].token_ids)
    else:
        import engine  # first: allocator and OpenMP settings before torch
        from engine import LLM, SamplingParams

        print(f"OpenMP wait policy {engine.omp_wait.state.policy}: {engine.omp_wait.state.reason}")

        llm = LLM(spec["model"], dtype=spec["dtype"], max_num_seqs=spec["batch"],
                  enable_prefix_caching=False)  # fmt: skip
        print(f"CPU threads: {llm.llm_engine.cpu_threads}")
        params = SamplingParams(max_tokens=spec["output_len"], temperature=0.0, ignore_eos=True)

        def generate() -> list[int]:
            return list(llm.generate(prompts, params)[0].outputs[0].token_ids)

    generate()  # warm-up: compiles and first allocations
    print("ready", flush=True)
    for _ in sys.stdin:
        t0 = time.perf_counter()
        tokens = generate()
        print(json.dumps({"s": time.perf_counter() - t0, "tokens": tokens}), flush=True)


# ---- the parent ---------------------------------------------------------------------------


@dataclass
class System:
    name: str
    proc: subprocess.Popen
    seconds: dict[str, list[float]] = field(default_factory=lambda: {c: [] for c in CONDITIONS})
    tokens: list[int] | None = None

    def run(self) -> float:
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()
        out = json.loads(_read_line(self.proc, self.name))
        if self.tokens is not None and out["tokens"] != self.tokens:
            print(f"  warning: {self.name}'s greedy tokens changed between rounds")
        self.tokens = out["tokens"]
        return out["s"]


def _read_line(proc: subprocess.Popen, name: str) -> str:
    line = proc.stdout.readline()
    if not line:
        raise SystemExit(f"{name} exited ({proc.wait()}); its log is beside the spec file")
    return line


def start(cmd: list[str], env: dict[str, str], log: Path | None, name: str) -> subprocess.Popen:
    from bench_cli.local_server import die_with_parent

    proc = subprocess.Popen(
        cmd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        stderr=log.open("w") if log else subprocess.DEVNULL, start_new_session=True,
        preexec_fn=functools.partial(die_with_parent, os.getpid()),
    )  # fmt: skip
    while (line := _read_line(proc, name).strip()) != "ready":
        print(f"  {name}: {line}")
    return proc


def machine_load() -> str:
    """The 1-minute load average (ours included), and the share of the machine's CPU time a
    hypervisor gave to other guests since the last call (a round, for a call a round): how
    busy the machine was, inside and out: a round with steal is not one to quote."""
    load = f"load average {os.getloadavg()[0]:.2f}"
    meter = _steal_meter()
    if meter is None:
        return load
    row: dict[str, float] = {}
    meter.sample(row)
    steal = row.get("machine_steal_percent", 0.0) / meter.cpus
    return f"{load}, steal {steal:.0f} %"


@functools.cache
def _steal_meter() -> Any:
    """loadgen's sampler of the machine's CPU counters (None without psutil or /proc/stat)."""
    sys.path.insert(0, str(HERE.parent))
    try:
        from loadgen.machine_cpu import MachineCpu

        meter = MachineCpu()
    except Exception:
        return None
    return meter if meter.has_steal else None


def fast_dtypes() -> list[str]:
    """float32 always; bfloat16 where this CPU has native bf16 (else it is ~500x slower)."""
    flags = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    return ["float32", "bfloat16"] if "avx512_bf16" in flags or "amx_bf16" in flags else ["float32"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--context", type=int, default=128)
    p.add_argument("--output-len", type=int, default=32)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--dtype", nargs="+", help="default: float32, and bfloat16 where native")
    p.add_argument("--conditions", nargs="+", default=list(CONDITIONS), choices=CONDITIONS)
    p.add_argument("--variant", action="append", default=[], metavar="NAME=VAR=VALUE[,...]",
                   help="our engine again with these environment variables")  # fmt: skip
    p.add_argument("--vllm-python", help="an interpreter that imports vllm (else no vLLM column)")
    args = p.parse_args()
    if args.child:
        return child(args.child)
    sys.path.insert(0, str(HERE.parent))
    from child_procs import stop_group

    dtypes = args.dtype or fast_dtypes()
    variants: dict[str, dict[str, str]] = {"default": {}}
    for v in args.variant:
        name, _, assigns = v.partition("=")
        variants[name] = dict(a.split("=", 1) for a in assigns.split(","))
    tmp = Path(tempfile.mkdtemp(prefix="noisy-"))
    systems: list[System] = []
    neighbour: subprocess.Popen | None = None
    print(f"{args.model}, B={args.batch}, {args.context} prompt / {args.output_len} generated "
          f"tokens, {os.cpu_count()} cores, {args.rounds} rounds; logs in {tmp}")  # fmt: skip
    try:
        for dtype in dtypes:
            for vname, extra in variants.items():
                name = f"ours {dtype} {vname}"
                spec = dict(vars(args), system="ours", dtype=dtype)
                (f := tmp / f"{len(systems)}.json").write_text(json.dumps(spec))
                env = {**os.environ, **extra}
                cmd = [sys.executable, __file__, "--child", str(f)]
                systems.append(System(name, start(cmd, env, f.with_suffix(".log"), name)))
        systems += vllm_systems(args, dtypes, tmp)
        for r in range(args.rounds):
            conds = args.conditions if r % 2 == 0 else args.conditions[::-1]
            for cond in conds:
                if cond != "quiet":
                    code = ["-c", NEIGHBOURS[cond]]
                    neighbour = start([sys.executable, *code], dict(os.environ), None, cond)
                    time.sleep(0.5)  # its threads up and running
                order = systems if r % 2 == 0 else systems[::-1]
                for s in order:
                    s.seconds[cond].append(s.run())
                if neighbour is not None:
                    stop_group(neighbour)
                    neighbour = None
                cells = "  ".join(f"{s.name} {s.seconds[cond][-1]:6.2f}" for s in systems)
                print(f"round {r + 1} {cond:<7} {cells} s   ({machine_load()})", flush=True)
    finally:
        for proc in [s.proc for s in systems] + ([neighbour] if neighbour else []):
            stop_group(proc, grace_s=5)
    report(systems, args.conditions)


def report(systems: list[System], conditions: list[str]) -> None:
    print(f"\n{'system':<28}" + "".join(f"{c + ' s':>11}" for c in conditions)
          + "".join(f"{c + '/quiet':>14}" for c in conditions if c != "quiet")
          + "   spread quiet (max/min)")  # fmt: skip
    for s in systems:
        med = {c: statistics.median(s.seconds[c]) for c in conditions}
        line = f"{s.name:<28}" + "".join(f"{med[c]:11.2f}" for c in conditions)
        if "quiet" in conditions:
            q = s.seconds["quiet"]
            line += "".join(f"{med[c] / med['quiet']:13.2f}x" for c in conditions if c != "quiet")
            line += f"   {max(q) / min(q):.2f}x"
        print(line)
    by_dtype: dict[str, list[System]] = {}
    for s in systems:
        by_dtype.setdefault(s.name.split()[1], []).append(s)
    for dtype, group in by_dtype.items():
        ref = group[0].tokens
        same = [s.name for s in group[1:] if s.tokens == ref]
        differ = [s.name for s in group[1:] if s.tokens != ref]
        if same or differ:
            print(f"{dtype}: first sequence's greedy tokens as {group[0].name}'s: "
                  f"{', '.join(same) or 'none'}; differ: {', '.join(differ) or '-'}")  # fmt: skip


def vllm_systems(args: argparse.Namespace, dtypes: list[str], tmp: Path) -> list[System]:
    python = args.vllm_python or sys.executable
    if subprocess.run([python, "-c", "import vllm"], capture_output=True).returncode:
        print(f"vllm does not import in {python}: its column is left out (--vllm-python)")
        return []
    import torch
    from vllm_side_by_side import vllm_env

    from engine.model.export import export_hf_dir
    from engine.model.loader import load_model

    env = vllm_env(argparse.Namespace(vllm_python=python, vllm_kv_gb=2, vllm_binding="all"))
    out = []
    for dtype in dtypes:
        folder = tmp / f"hf-{dtype}"
        model = load_model(args.model, getattr(torch, dtype), torch.device("cpu"))
        model_dir = str(export_hf_dir(model, folder))
        spec = dict(vars(args), system="vllm", dtype=dtype, model_dir=model_dir)
        (f := tmp / f"vllm-{dtype}.json").write_text(json.dumps(spec))
        cmd = [python, __file__, "--child", str(f)]
        name = f"vllm {dtype}"
        out.append(System(name, start(cmd, env, f.with_suffix(".log"), name)))
    return out


if __name__ == "__main__":
    main()
