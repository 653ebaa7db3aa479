"""The simulated engine against the real one on a GPU: the bundled engine serves a
Llama-3.1-8B-shaped model with dummy weights (SmolLM2's 49,152-token vocabulary, so its
tokenizer builds the prompts) at two Poisson loads; then, on any machine, each load is
simulated on the GPU's spec with the roofline's assumed efficiencies, calibrated on the other
load's steps (`bench calibrate --from-run`), and with the roofline's efficiencies fitted on
the other load, and the errors printed. README: "Against a GPU".

    python benchmarks/sim_gpu_compare.py model DIR           # the config.json + tokenizer
    python benchmarks/sim_gpu_compare.py real DIR OUT [--cuda-graphs]   # on the GPU machine
    python benchmarks/sim_gpu_compare.py simulate DIR OUT --device h200 # anywhere, after
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from child_procs import run_group

LLAMA_8B_SHAPE = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0,
    "max_position_embeddings": 8192,
    "tie_word_embeddings": False,
    "vocab_size": 49152,  # SmolLM2's, whose tokenizer builds the prompts
    "bos_token_id": 1,
    "eos_token_id": 2,
}
LOADS = {"r4": ("4", "160"), "r16": ("16", "400")}  # name: (rate, requests)
COMMON = ["--dtype", "bfloat16", "--input-len", "256", "--output-len", "128", "--seed", "11"]
COMMON += ["--max-num-seqs", "256", "--warmup", "4", "--no-dashboard"]
METRICS = [
    ("TTFT mean", "ttft_s", "mean"),
    ("TTFT p99", "ttft_s", "p99"),
    ("TPOT p50", "tpot_s", "p50"),
    ("TPOT p99", "tpot_s", "p99"),
    ("E2E mean", "e2e_s", "mean"),
    ("output tok/s", "output_throughput", None),
]


def bench(*args: str) -> None:
    run_group([sys.executable, "-m", "bench_cli", *args], check=True)


def make_model(folder: Path) -> None:
    from engine.model.export import export_tokenizer
    from engine.model.sources import load_tokenizer

    tokenizer = load_tokenizer("smollm2-135m")
    assert tokenizer is not None
    export_tokenizer(tokenizer, folder)
    (folder / "config.json").write_text(json.dumps(LLAMA_8B_SHAPE, indent=1) + "\n")
    print(f"model: {folder}/ (config.json, tokenizer.json, tokenizer_config.json)")


def real(model: Path, out: Path, graphs: bool) -> None:
    flags = ["--model", str(model), "--load-format", "dummy", "--device", "cuda", *COMMON]
    flags += ["--cuda-graphs"] if graphs else []
    for name, (rate, n) in LOADS.items():
        bench("run", *flags, "--rate", rate, "--num-requests", n, "--out", str(out / name))


def simulate(model: Path, out: Path, device: str) -> None:
    engine = json.loads((out / "r4" / "config.json").read_text())["engine"]
    flags = ["--engine", "sim", "--sim-device", device, "--model", str(model), *COMMON]
    flags += ["--num-kv-blocks", str(engine["cache"]["num_kv_blocks"])]  # the real pool
    flags += ["--cuda-graphs"] if engine.get("cuda_graphs") else []
    rows = []
    for name, (rate, n) in LOADS.items():
        other = next(o for o in LOADS if o != name)
        profile = out / f"calibrated-on-{other}.json"
        bench("calibrate", "--model", str(model), "--from-run", str(out / other),
              "--out", str(profile))  # fmt: skip
        load = ["--rate", rate, "--num-requests", n]
        for label, cost in (
            ("roofline (assumed)", ["--sim-cost-model", "roofline"]),
            (f"calibrated on {other}", ["--sim-profile", str(profile)]),
            (f"roofline fitted on {other}",
             ["--sim-cost-model", "roofline", "--sim-profile", str(profile)]),
        ):  # fmt: skip
            sim = out / f"sim-{name}-{''.join(c if c.isalnum() else '-' for c in label)}"
            bench("run", *flags, *cost, *load, "--out", str(sim))
            rows.append((f"{name}, {label}", out / name, sim))
    print("\n| load, cost model | " + " | ".join(m[0] for m in METRICS) + " |")
    print("|---" * (len(METRICS) + 1) + "|")
    for label, real_dir, sim_dir in rows:
        r = json.loads((real_dir / "summary.json").read_text())
        s = json.loads((sim_dir / "summary.json").read_text())
        cells = []
        for _, key, stat in METRICS:
            a, b = (r[key], s[key]) if stat is None else (r[key][stat], s[key][stat])
            scale = 1 if stat is None else 1e3
            cells.append(f"{a * scale:.1f} / {b * scale:.1f} ({b / a - 1:+.0%})")
        print(f"| {label} | " + " | ".join(cells) + " |")
    print("(real / simulated, ms or tok/s)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("what", choices=["model", "real", "simulate"])
    ap.add_argument("model", type=Path, help="the folder of the config.json and tokenizer")
    ap.add_argument("out", type=Path, nargs="?", default=Path("sim-gpu-compare"))
    ap.add_argument("--cuda-graphs", action="store_true")
    ap.add_argument("--device", default="h200", help="the GPU's built-in spec (simulate)")
    args = ap.parse_args()
    if args.what == "model":
        make_model(args.model)
    elif args.what == "real":
        real(args.model, args.out, args.cuda_graphs)
    else:
        simulate(args.model, args.out, args.device)


if __name__ == "__main__":
    main()
