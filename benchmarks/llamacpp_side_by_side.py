"""Our engine against llama.cpp on this machine: decode tok/s on the same weights, shapes,
dtypes and threads, alternating rounds in one run.

    python benchmarks/llamacpp_side_by_side.py --setup ~/llamacpp          # once, ~15 min
    python benchmarks/llamacpp_side_by_side.py --llamacpp-dir ~/llamacpp   # B = 1, 8, 32
    python benchmarks/llamacpp_side_by_side.py --llamacpp-dir ~/llamacpp --batch 1 8 \\
        --rounds 5 --dtype float32 --json out.json

Setup (`--setup DIR`): downloads the sdist of llama-cpp-python (which vendors llama.cpp's
sources), builds only `llama-batched-bench` and `llama-quantize` from them with cmake (Release,
CPU only, -march=native, nothing fetched during the build; cmake and ninja are installed into
a venv under DIR where the machine lacks them), and converts the model's GGUF (SmolLM2-135M's
Q4_1 by default, which our engine dequantizes) to F32 and BF16 with `llama-quantize`. It
writes DIR/setup.json, which the measuring run reads.

Measuring: for each dtype (float32, and bfloat16 where the CPU has native bf16) and each B,
llama.cpp runs `llama-batched-bench -t T -npp P -ntg G -npl B` (a process per run: B random
prompts of P tokens, then G decode steps of B tokens; its S_TG column, B*G / decode seconds)
and our engine, one long-lived process per dtype, prefills B random prompts of P tokens and
times the G decode steps that follow (greedy, EOS ignored: the same forward passes, B tokens
each at positions P .. P+G-1); tok/s = tokens generated in those steps / their seconds. The
sides alternate (which goes first flips each round) for `--rounds` rounds; each round prints
both figures and the load average (the machine may be shared), then the medians and the ratio
ours / llama.cpp per (dtype, B), and `--json` gets everything. llama.cpp's KV cache has the
model's dtype (`-ctk/-ctv`; its default is f16: `--llamacpp-kv default`). Our engine picks
OpenMP's wait policy by the machine's load (engine/omp_wait.py) and prints it; llama.cpp keeps
libgomp's default (spinning) unless `--llamacpp-env OMP_WAIT_POLICY=PASSIVE`: on a busy machine
that alone changed its speed ~5x (docs/results/2026-12-07-llamacpp.md). batched-bench samples
no tokens, so no greedy outputs are compared. Every child is stopped on every exit path."""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from llamacpp_tools import GGUF_TYPES, LLAMACPP_SPEC, cpu_name, run_llamacpp, setup

HERE = Path(__file__).resolve().parent


# ---- medians and ratios -------------------------------------------------------------------


def summarize(rounds: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (dtype, B), in first-seen order: each side's per-round tok/s and median, the ratio
    of the medians (ours / llama.cpp) and the spread of the per-round ratios."""
    groups: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for r in rounds:
        groups.setdefault((r["dtype"], r["batch"]), []).append(r)
    out = []
    for (dtype, batch), rs in groups.items():
        ours = [r["ours_tok_s"] for r in rs]
        theirs = [r["llamacpp_tok_s"] for r in rs]
        per_round = [a / b for a, b in zip(ours, theirs, strict=True)]
        med_ours, med_theirs = statistics.median(ours), statistics.median(theirs)
        out.append({"dtype": dtype, "batch": batch, "rounds": len(rs),
                    "ours_tok_s": ours, "llamacpp_tok_s": theirs,
                    "ours_median": med_ours, "llamacpp_median": med_theirs,
                    "ratio": med_ours / med_theirs,
                    "ratio_min": min(per_round), "ratio_max": max(per_round)})  # fmt: skip
    return out


def print_summary(summary: list[dict[str, Any]]) -> None:
    print(f"\n{'dtype':<9} {'B':>3} {'llama.cpp tok/s':>16} {'ours tok/s':>11} "
          f"{'ours/llama.cpp':>15}   per-round ratios (min-max)")  # fmt: skip
    for s in summary:
        print(f"{s['dtype']:<9} {s['batch']:3d} {s['llamacpp_median']:16.1f} "
              f"{s['ours_median']:11.1f} {s['ratio']:14.2f}x   "
              f"{s['ratio_min']:.2f}-{s['ratio_max']:.2f}x")  # fmt: skip


# ---- our engine's side: one long-lived process per dtype ----------------------------------


def engine_child(spec_file: str) -> None:
    """Load once, time each batch size once (a warm-up), print 'ready {info}'; then per stdin
    line 'B SEED' one measurement, printed as 'result {json}'."""
    spec = json.loads(Path(spec_file).read_text())
    # isort: off
    import engine  # first: allocator and OpenMP settings before torch

    # isort: on
    import torch

    from engine.config import EngineConfig
    from engine.engine import LLMEngine

    omp = engine.omp_wait.state
    torch.set_num_threads(spec["threads"])
    biggest = max(spec["batch"])
    eng = LLMEngine(EngineConfig.from_kwargs(
        spec["model"], dtype=spec["dtype"], max_num_seqs=biggest, enable_prefix_caching=False,
        max_num_batched_tokens=biggest * spec["prompt_len"]))  # fmt: skip
    info = {"torch": torch.__version__, "threads": spec["threads"],
            "cpu_threads": eng.cpu_threads,
            "dtype": eng.config.dtype, "kv_cache_dtype": eng.config.cache.kv_cache_dtype,
            "linears": eng.linears, "model_forward": eng.model_forward,
            "decode_attention": eng.decode_attention,
            "omp_wait": f"{omp.policy}: {omp.reason}"}  # fmt: skip
    for b in spec["batch"]:
        measure(eng, b, spec["prompt_len"], spec["gen_len"], seed=-b)
    print("ready " + json.dumps(info), flush=True)
    for line in sys.stdin:
        b, seed = map(int, line.split())
        result = measure(eng, b, spec["prompt_len"], spec["gen_len"], seed)
        print("result " + json.dumps(result), flush=True)


def measure(eng: Any, batch: int, prompt_len: int, gen_len: int, seed: int) -> dict[str, Any]:
    """B random prompts prefilled in one (untimed) step, then gen_len decode steps timed: the
    forward passes of batched-bench's TG phase. Raises where the steps were not those."""
    from engine.core.request import SamplingParams

    rng = random.Random(seed)
    vocab = eng.model_config.vocab_size
    # one token from the prefill's logits, then gen_len decode steps of B tokens each
    params = SamplingParams(max_tokens=gen_len + 1, temperature=0.0, ignore_eos=True)
    for i in range(batch):
        prompt = [rng.randrange(vocab) for _ in range(prompt_len)]
        eng.add(eng.make_request(f"s{seed}-b{batch}-{i}", prompt, params))
    t0 = time.perf_counter()
    eng.step()
    prefill_s = time.perf_counter() - t0
    running = eng.scheduler.running
    if eng.num_waiting or len(running) != batch or any(r.num_output_tokens != 1 for r in running):
        raise RuntimeError(f"B={batch}: the prompts did not prefill in one step")
    tokens = 0
    t0 = time.perf_counter()
    for _ in range(gen_len):
        tokens += sum(len(o.new_token_ids) for o in eng.step())
    decode_s = time.perf_counter() - t0
    if tokens != batch * gen_len or eng.has_unfinished_requests():
        raise RuntimeError(f"B={batch}: {tokens} tokens in {gen_len} steps, not {batch * gen_len}")
    return {"decode_s": decode_s, "tokens": tokens, "tok_s": tokens / decode_s,
            "prefill_s": prefill_s}  # fmt: skip


# ---- the parent ---------------------------------------------------------------------------


class EngineSide:
    """Our engine in a child process of its own (own process group, dies with us)."""

    def __init__(self, spec: dict[str, Any], workdir: Path, threads: int) -> None:
        import functools

        from bench_cli.local_server import die_with_parent

        self.name = f"ours {spec['dtype']}"
        f = workdir / f"ours-{spec['dtype']}.json"
        f.write_text(json.dumps(spec))
        self.log = f.with_suffix(".log")
        env = dict(os.environ, OMP_NUM_THREADS=str(threads))
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--engine-child", str(f)], env=env, text=True,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log.open("w"),
            start_new_session=True, preexec_fn=functools.partial(die_with_parent, os.getpid()),
        )  # fmt: skip
        self.info: dict[str, Any] = {}

    def wait_ready(self) -> None:
        self.info = json.loads(self._reply("ready"))

    def _reply(self, kind: str) -> str:
        while line := self.proc.stdout.readline():
            if line.startswith(kind + " "):
                return line.removeprefix(kind + " ")
            print(f"  {self.name}: {line.rstrip()}")
        raise SystemExit(f"{self.name} exited ({self.proc.wait()}); its log: {self.log}")

    def measure(self, batch: int, seed: int) -> dict[str, Any]:
        self.proc.stdin.write(f"{batch} {seed}\n")
        self.proc.stdin.flush()
        return json.loads(self._reply("result"))


def compare(args: argparse.Namespace) -> None:
    from child_procs import signals_exit, stop_group
    from noisy_neighbour import fast_dtypes, machine_load

    setup_info = json.loads((Path(args.llamacpp_dir).expanduser() / "setup.json").read_text())
    if setup_info["model"] != args.model:
        raise SystemExit(f"{args.llamacpp_dir} holds {setup_info['model']}, not {args.model}: "
                         f"run --setup with --model {args.model}")  # fmt: skip
    native = fast_dtypes()
    if "bfloat16" not in native:
        print(
            "this CPU has no native bf16 (no AVX512-BF16 or AMX): bfloat16 left out"
            + (", unless asked for (then slow on both sides)" if args.dtype else "")
        )
    dtypes = args.dtype or native
    workdir = Path(tempfile.mkdtemp(prefix="llamacpp-side-by-side-"))
    load_start = os.getloadavg()
    print(f"{args.model}: B = {args.batch}, {args.prompt_len} prompt / {args.gen_len} generated "
          f"tokens, {args.threads} threads each side, {args.rounds} rounds alternating; "
          f"{cpu_name()}, {os.cpu_count()} cores, {machine_load()}; logs in {workdir}")  # fmt: skip
    sides: dict[str, EngineSide] = {}
    records: list[dict[str, Any]] = []
    try:
        with signals_exit():  # SIGTERM/SIGHUP run the finally below too
            for dtype in dtypes:
                spec = {"model": args.model, "dtype": dtype, "batch": args.batch,
                        "prompt_len": args.prompt_len, "gen_len": args.gen_len,
                        "threads": args.threads}  # fmt: skip
                sides[dtype] = EngineSide(spec, workdir, args.threads)
                sides[dtype].wait_ready()
                print(f"  ours {dtype}: {sides[dtype].info}")
            for r in range(args.rounds):
                for dtype in dtypes:
                    for batch in args.batch:
                        records.append(one_pair(args, setup_info, sides[dtype], dtype, batch,
                                                r, workdir))  # fmt: skip
                        rec = records[-1]
                        if r == 0 and batch == args.batch[0]:
                            print(f"  llama.cpp {dtype}: {rec['llamacpp_settings']}")
                        print(f"round {r + 1} {dtype:<8} B={batch:<3} llama.cpp "
                              f"{rec['llamacpp_tok_s']:7.1f}  ours {rec['ours_tok_s']:7.1f} tok/s"
                              f"  ours/llama.cpp {rec['ours_tok_s'] / rec['llamacpp_tok_s']:.2f}x"
                              f"  ({machine_load()})", flush=True)  # fmt: skip
    finally:
        for side in sides.values():
            stop_group(side.proc, grace_s=5)
    summary = summarize(records)
    print_summary(summary)
    out = Path(args.json or HERE.parent / "results" /
               f"llamacpp-side-by-side-{time.strftime('%Y%m%d-%H%M%S')}.json")  # fmt: skip
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "command": sys.argv,
        "machine": {"cpu": cpu_name(), "cores": os.cpu_count(), "native_bf16": native,
                    "load_start": load_start, "load_end": os.getloadavg(),
                    "shared": "other processes may have run: see each round's load"},
        "settings": {k: v for k, v in vars(args).items() if k not in ("engine_child", "setup")},
        "llamacpp": setup_info, "ours": {d: s.info for d, s in sides.items()},
        "rounds": records, "summary": summary}, indent=1))  # fmt: skip
    print(f"written {out}")


def one_pair(args: argparse.Namespace, setup_info: dict, side: EngineSide, dtype: str,
             batch: int, r: int, workdir: Path) -> dict[str, Any]:  # fmt: skip
    """One round of one (dtype, B): both sides, the first one alternating by round."""
    order = ("llama.cpp", "ours") if r % 2 == 0 else ("ours", "llama.cpp")
    rec: dict[str, Any] = {"round": r + 1, "dtype": dtype, "batch": batch, "order": order}
    for name in order:
        if name == "ours":
            got = side.measure(batch, seed=r)
            rec.update(ours_tok_s=got["tok_s"], ours_decode_s=got["decode_s"],
                       ours_prefill_s=got["prefill_s"])  # fmt: skip
        else:
            log = workdir / f"llamacpp-{dtype}-B{batch}-r{r + 1}.log"
            got = run_llamacpp(setup_info, args, dtype, batch, log)
            row = next(x for x in got["rows"] if x["b"] == batch)
            rec.update(llamacpp_tok_s=got["tok_s"], llamacpp_decode_s=row["t_tg_s"],
                       llamacpp_prefill_s=row["t_pp_s"], llamacpp_settings=got["settings"],
                       llamacpp_command=got["command"], llamacpp_env=got["env"])  # fmt: skip
    rec["load"] = os.getloadavg()
    return rec


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--engine-child", help=argparse.SUPPRESS)
    p.add_argument("--setup", metavar="DIR", type=Path, help="build llama.cpp into DIR, once")
    p.add_argument("--llamacpp-spec", default=LLAMACPP_SPEC, help="the sdist pip downloads")
    p.add_argument("--jobs", type=int, default=os.cpu_count(), help="build jobs")
    p.add_argument("--llamacpp-dir", metavar="DIR", help="what --setup DIR made")
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--dtype", nargs="+", choices=list(GGUF_TYPES),
                   help="default: float32, and bfloat16 where the CPU has native bf16")  # fmt: skip
    p.add_argument("--batch", type=int, nargs="+", default=[1, 8, 32])
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--gen-len", type=int, default=64, help="decode steps timed")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=os.cpu_count(), help="each side's threads")
    p.add_argument("--llamacpp-kv", choices=["match", "default"], default="match",
                   help="llama.cpp's KV cache: the model's dtype, or its f16")  # fmt: skip
    p.add_argument("--llamacpp-env", action="append", default=[], metavar="VAR=VALUE",
                   help="llama.cpp's environment, e.g. OMP_WAIT_POLICY=PASSIVE")  # fmt: skip
    p.add_argument("--json", help="default: results/llamacpp-side-by-side-<time>.json")
    args = p.parse_args()
    sys.path.insert(0, str(HERE.parent))  # the repository: engine, bench_cli
    if args.engine_child:
        return engine_child(args.engine_child)
    if args.setup:
        return setup(args.setup, args.llamacpp_spec, args.model, args.jobs)
    if not args.llamacpp_dir:
        p.error("--llamacpp-dir is required (make one with --setup DIR)")
    compare(args)


if __name__ == "__main__":
    main()
