"""Offline throughput, side by side in one process: our engine (continuous and static
batching) against Hugging Face transformers' batched `generate`, same model, dtype, prompts.

    python benchmarks/engine_throughput.py                       # 64 x (256 in, 128 out)
    python benchmarks/engine_throughput.py --num-prompts 32 --prompt-len 128 --output-len 64
    python benchmarks/engine_throughput.py --mixed-output        # output lengths 16..2*output_len
    python benchmarks/engine_throughput.py --fp8 --skip static transformers  # + fp8 rows
    python benchmarks/engine_throughput.py --mkl-row  # + a row without oneDNN-packed linears
    python benchmarks/engine_throughput.py --eager-row  # + a row without compiled attention

Every request is forced to its output length (ignore_eos / min_new_tokens): a run that stops
at EOS early would overstate speed. With --mixed-output, output lengths vary per request,
which is where continuous batching leaves static batching behind."""

from __future__ import annotations

import argparse
import os
import time
from dataclasses import dataclass
from typing import Any

# isort: off
import engine  # noqa: F401 (first: it tunes glibc's allocator before torch allocates)

# isort: on
import torch

from engine.resolve import resolve_device, resolve_dtype

os.environ.setdefault("HF_HUB_OFFLINE", "1")


@dataclass
class Result:
    name: str
    seconds: float
    output_tokens: int
    prompt_tokens: int
    token_ids: list[list[int]] | None = None  # each request's output, for comparisons

    @property
    def output_tps(self) -> float:
        return self.output_tokens / self.seconds


def make_workload(args: argparse.Namespace) -> tuple[list[list[int]], list[int]]:
    g = torch.Generator().manual_seed(args.seed)
    # Ordinary vocabulary ids (SmolLM2's first 17 ids are special tokens).
    prompts = [
        torch.randint(17, 49152, (args.prompt_len,), generator=g).tolist()
        for _ in range(args.num_prompts)
    ]
    if args.mixed_output:
        lens = torch.randint(16, 2 * args.output_len + 1, (args.num_prompts,), generator=g).tolist()
    else:
        lens = [args.output_len] * args.num_prompts
    return prompts, lens


FP8_VARIANTS = {
    "fp8 weights": {"quantization": "fp8"},
    "fp8 weights+KV": {"quantization": "fp8", "kv_cache_dtype": "fp8"},
}


def run_ours(
    args: argparse.Namespace,
    batching: str,
    prompts: list[list[int]],
    lens: list[int],
    label: str = "",
    **engine_args: Any,
) -> Result:
    from engine import LLM, SamplingParams

    llm = LLM(
        args.model,
        dtype=args.dtype,
        batching=batching,
        max_num_seqs=args.max_num_seqs,
        **engine_args,
    )
    warm = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
    llm.generate(prompts[:2], warm)
    params = [SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True) for n in lens]
    t0 = time.perf_counter()
    outs = llm.generate(prompts, params)
    seconds = time.perf_counter() - t0
    assert [len(o.outputs[0].token_ids) for o in outs] == lens
    stats = llm.llm_engine.stats()
    forward = llm.llm_engine.model_forward
    print(f"  ours/{batching}: {stats['num_steps']} steps, {stats['num_preemptions']} preemptions"
          f", forward {forward}")  # fmt: skip
    name = f"servebench {batching}" + (f" {label}" if label else "")
    fell_back = forward == "eager" and llm.llm_engine.device.type == "cpu"
    if fell_back and not engine_args.get("enforce_eager"):
        # The compiled forward failed to build (its warning is above): what ran is not the
        # engine users get. Seen with an inductor cache whose headers lacked the vector ISA.
        print(f"  WARNING: ours ran eager, not compiled: {name} measures a fallback")
        name += " [EAGER FALLBACK]"
    tokens = [list(o.outputs[0].token_ids) for o in outs]
    return Result(name, seconds, sum(lens), sum(map(len, prompts)), tokens)


def run_transformers(args: argparse.Namespace, prompts: list[list[int]], lens: list[int]) -> Result:
    """Batched generate in chunks of max_num_seqs; every request of a chunk runs to the
    chunk's longest output (that is how static batching behaves)."""
    from transformers import AutoModelForCausalLM

    from engine.model.loader import resolve_model_path

    path = resolve_model_path(args.model)
    dtype = {"bfloat16": torch.bfloat16, "float32": torch.float32}[args.dtype]
    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=dtype)
    model.generation_config.pad_token_id = 0
    with torch.inference_mode():
        ids = torch.tensor(prompts[:2])
        model.generate(ids, max_new_tokens=4, min_new_tokens=4, do_sample=False)
        t0 = time.perf_counter()
        for i in range(0, len(prompts), args.max_num_seqs):
            ids = torch.tensor(prompts[i : i + args.max_num_seqs])
            n = max(lens[i : i + args.max_num_seqs])
            model.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False)
        seconds = time.perf_counter() - t0
    # Only the tokens each request asked for count as useful output.
    return Result("transformers generate", seconds, sum(lens), sum(map(len, prompts)))


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--dtype", default="auto", choices=["auto", "bfloat16", "float32"])
    p.add_argument("--num-prompts", type=int, default=64)
    p.add_argument("--prompt-len", type=int, default=256)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--max-num-seqs", type=int, default=64)
    p.add_argument("--mixed-output", action="store_true")
    p.add_argument("--fp8", action="store_true", help="add continuous rows with fp8 weights/KV")
    p.add_argument(
        "--mkl-row",
        action="store_true",
        help="add a continuous row with MKL's plain linears instead of oneDNN-packed ones",
    )
    p.add_argument(
        "--eager-row",
        action="store_true",
        help="add a continuous row with enforce_eager (no compiled decode attention)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    p.add_argument(
        "--skip", nargs="*", default=[], choices=["continuous", "static", "transformers"]
    )
    args = p.parse_args()
    # One concrete dtype for every side (auto: bf16 only where the CPU runs it natively).
    args.dtype = resolve_dtype(args.dtype, resolve_device("auto"))
    if args.threads:
        torch.set_num_threads(args.threads)
    prompts, lens = make_workload(args)
    print(
        f"{args.num_prompts} prompts x {args.prompt_len} tokens, output "
        f"{'16..' + str(2 * args.output_len) if args.mixed_output else args.output_len} tokens, "
        f"{args.model} {args.dtype}, max_num_seqs={args.max_num_seqs}, "
        f"torch {torch.__version__} with {torch.get_num_threads()} threads"
    )
    results: list[Result] = []

    def record(r: Result) -> None:
        print(f"  {r.name}: {r.seconds:.1f} s, {r.output_tps:.1f} output tok/s")
        results.append(r)

    for name in ("continuous", "static", "transformers"):
        if name not in args.skip:
            record(
                run_transformers(args, prompts, lens)
                if name == "transformers"
                else run_ours(args, name, prompts, lens)
            )
    for label, engine_args in FP8_VARIANTS.items() if args.fp8 else ():
        record(run_ours(args, "continuous", prompts, lens, label, **engine_args))
    if args.mkl_row:
        os.environ["SERVEBENCH_ONEDNN"] = "0"  # read when the engine loads its model
        record(run_ours(args, "continuous", prompts, lens, "MKL linears"))
        del os.environ["SERVEBENCH_ONEDNN"]
    if args.eager_row:
        record(run_ours(args, "continuous", prompts, lens, "eager", enforce_eager=True))
    w = max(len(r.name) for r in results) + 4
    print(
        f"\n{'system':<40}{'seconds':>9}{'out tok/s':>11}{'total tok/s':>13}"
        + "".join(f"{'/ ' + r.name:>{w}}" for r in results)
    )
    for r in results:
        total = (r.output_tokens + r.prompt_tokens) / r.seconds
        ratios = "".join(f"{r.output_tps / o.output_tps:>{w}.2f}" for o in results)
        print(f"{r.name:<40}{r.seconds:>9.1f}{r.output_tps:>11.1f}{total:>13.1f}{ratios}")


if __name__ == "__main__":
    main()
