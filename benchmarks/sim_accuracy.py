"""How close the simulated engine comes to the real one on this machine: calibrate on one
run (`bench calibrate`), then run other loads (rates, batching, chunk size, prefix caching,
speculative decoding with the acceptance the real run measured) on the real engine and on the
simulation with the same seeds, and print the error of each metric. Real runs take minutes
each: run it alone on a quiet machine.

    python benchmarks/sim_accuracy.py [--profile PATH] [--num-requests 60] [--only NAME,...]
    python benchmarks/sim_accuracy.py --repeat-real ...   # each real load twice: its own spread
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
from child_procs import run_group

from loadgen.benchmark import draft_shares_by_request
from loadgen.records import read_records

# name -> bench run flags (over the common load below); the calibration load is another one.
SCENARIOS: dict[str, list[str]] = {
    "poisson 0.25/s": ["--rate", "0.25"],
    "poisson 0.5/s": ["--rate", "0.5"],
    "poisson 0.8/s": ["--rate", "0.8"],
    "closed loop, 4 users": ["--concurrency", "4"],
    "static batches of 8, 0.5/s": ["--rate", "0.5", "--batching", "static", "--max-num-seqs", "8"],
    "static batches of 8, 0.3/s": ["--rate", "0.3", "--batching", "static", "--max-num-seqs", "8"],
    "chunk 64 tokens, 0.5/s": ["--rate", "0.5", "--max-num-batched-tokens", "64"],
    "chunk 64 tokens, 0.3/s": ["--rate", "0.3", "--max-num-batched-tokens", "64"],
    "shared prefix, cache on, 0.4/s": [
        "--rate", "0.4", "--shared-prefix-len", "256", "--num-prefix-groups", "2",
    ],
    "shared prefix, cache off, 0.4/s": [
        "--rate", "0.4", "--shared-prefix-len", "256", "--num-prefix-groups", "2",
        "--no-enable-prefix-caching",
    ],
    # The simulation is given the acceptance by draft position and the share of decodes given a
    # draft that the real run measured.
    "n-gram k=4, 0.3/s": [
        "--rate", "0.3", "--speculative-config", '{"method": "ngram", "num_speculative_tokens": 4}',
    ],
    "draft 24 layers k=2, 0.3/s": [
        "--rate", "0.3", "--speculative-config",
        '{"method": "draft_layers", "num_speculative_tokens": 2, "num_draft_layers": 24}',
    ],
}  # fmt: skip
# Prompts of 32-256 tokens, loads below saturation on 2 cores (SmolLM2, float32). The table
# gives the real engine's mean queueing delay (arrival to first step): where requests wait
# long (static batches wait for the running batch), any step-time error is amplified.
COMMON = ["--input-len", "uniform:32:256", "--output-len", "uniform:16:96", "--seed", "11"]
AGAIN = ", real again"  # the row of a scenario's second real run against its first
METRICS = [  # (label, summary key, stat)
    ("TTFT mean", "ttft_s", "mean"),
    ("TTFT p99", "ttft_s", "p99"),
    ("TPOT p50", "tpot_s", "p50"),
    ("TPOT p99", "tpot_s", "p99"),
    ("ITL mean", "itl_s", "mean"),
    ("E2E mean", "e2e_s", "mean"),
    ("output tok/s", "output_throughput", None),
]


def bench(args: list[str], out: Path) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "bench_cli", "run", "--no-dashboard", "--out", str(out), *args]
    proc = run_group(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    return json.loads((out / "summary.json").read_text())


def value(summary: dict[str, Any], key: str, stat: str | None) -> float:
    v = summary[key]
    return float(v[stat] if stat else v)


def e2e_by_request(folder: Path) -> dict[str, float]:
    out = {}
    for line in (folder / "requests.jsonl").read_text().splitlines():
        r = json.loads(line)
        if not r["warmup"] and r["status"] == "ok":
            out[r["request_id"]] = r["end_s"] - r["send_s"]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--profile", help="a calibration profile (default: calibrate now)")
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--num-requests", type=int, default=30)
    ap.add_argument("--only", help="scenarios to run, comma-separated substrings")
    ap.add_argument("--out", help="folder for the runs (default: a temporary one)")
    ap.add_argument(
        "--reuse-real", action="store_true", help="keep real runs already in --out (new sims)"
    )
    ap.add_argument(
        "--draft-share",
        choices=("single", "per-request"),
        default="single",
        help="speculative scenarios: give the simulation the real run's share of decodes given "
        "a draft, one for all, or per request (its spread; see the README for how each did)",
    )
    ap.add_argument(
        "--repeat-real",
        action="store_true",
        help="run each real load twice and add a row of the second against the first: the "
        "machine's own run-to-run spread, which no simulation can be expected to beat",
    )
    ap.add_argument(
        "--leave-one-out",
        action="store_true",
        help="calibrate each scenario's simulation on the other scenarios' real runs (bench "
        "calibrate --from-run), not on one calibration load: the machine's drift over the "
        "session then weighs on every prediction alike",
    )
    args = ap.parse_args()
    root = Path(args.out or tempfile.mkdtemp(prefix="sim-accuracy-"))
    root.mkdir(parents=True, exist_ok=True)
    profile = args.profile
    if profile is None and args.leave_one_out:
        if not args.reuse_real:
            raise SystemExit("--leave-one-out fits to earlier real runs: give --reuse-real")
    elif profile is None:
        profile = str(root / "calibration.json")
        cmd = [sys.executable, "-m", "bench_cli", "calibrate", "--model", args.model]
        run_group([*cmd, "--out", profile], check=True)
    base = ["--model", args.model, "--num-requests", str(args.num_requests), "--warmup", "2"]
    wanted = [s.strip() for s in (args.only or "").split(",") if s.strip()]
    rows = []
    for name, flags in SCENARIOS.items():
        if wanted and not any(w in name for w in wanted):
            continue
        slug = "".join(c if c.isalnum() else "-" for c in name)
        real_dir, sim_dir = root / f"{slug}-real", root / f"{slug}-sim"
        if args.reuse_real and (real_dir / "summary.json").is_file():
            real = json.loads((real_dir / "summary.json").read_text())
        else:
            real = bench([*base, *COMMON, *flags], real_dir)
        shutil.rmtree(sim_dir, ignore_errors=True)
        if args.leave_one_out:
            profile = str(root / f"{slug}-calibration.json")
            others = [str(p) for p in sorted(root.glob("*-real")) if p != real_dir]
            cmd = [sys.executable, "-m", "bench_cli", "calibrate", "--model", args.model]
            for other in others:
                cmd += ["--from-run", other]
            run_group([*cmd, "--out", profile], check=True, capture_output=True)
        sim_flags = [*base, *COMMON, *flags, "--engine", "sim", "--sim-profile", profile]
        if rates := real["telemetry"].get("spec_acceptance_per_pos"):
            sim_flags += ["--sim-acceptance", ",".join(f"{r:.4f}" for r in rates)]
            sim_flags += ["--sim-draft-share", draft_share(real, real_dir, args.draft_share)]
        sim = bench(sim_flags, sim_dir)
        real["queue_ms"] = queue_ms(real_dir)
        rows.append((name, real, sim, compare(real, sim, real_dir, sim_dir)))
        say(rows[-1])
        if args.repeat_real:  # the same load and seeds on the real engine again
            again_dir = root / f"{slug}-real-again"
            if not (args.reuse_real and (again_dir / "summary.json").is_file()):
                bench([*base, *COMMON, *flags], again_dir)
            again = json.loads((again_dir / "summary.json").read_text())
            rows.append((name + AGAIN, real, again, compare(real, again, real_dir, again_dir)))
            say(rows[-1])
    print_table(rows)
    print(f"runs: {root}")


def say(row: tuple[str, dict, dict, dict[str, float]]) -> None:
    name, *_, errors = row
    print(f"{name}: " + ", ".join(f"{k} {v:+.1%}" for k, v in errors.items()), flush=True)


def compare(
    real: dict[str, Any], other: dict[str, Any], real_dir: Path, other_dir: Path
) -> dict[str, float]:
    """Each metric's relative error of `other` against `real`, and per request E2E's."""
    errors = {}
    for label, key, stat in METRICS:
        r, s = value(real, key, stat), value(other, key, stat)
        errors[label] = (s - r) / r if r else float("nan")
    real_e2e, other_e2e = e2e_by_request(real_dir), e2e_by_request(other_dir)
    common = sorted(set(real_e2e) & set(other_e2e))
    per_req = [abs(other_e2e[k] / real_e2e[k] - 1) for k in common]
    errors["E2E per request (mean |err|)"] = float(np.mean(per_req)) if per_req else np.nan
    return errors


def draft_share(real: dict[str, Any], folder: Path, how: str) -> str:
    """--sim-draft-share for a speculative scenario: the real run's overall share, or each
    request's (its summary's; worked out from its records for runs older than that field)."""
    t = real["telemetry"]
    if how == "per-request" and "spec_draft_share_by_request" not in t:
        measured = [r for r in read_records(folder / "requests.jsonl") if not r.warmup]
        draft_shares_by_request(real, measured)
    shares = t.get("spec_draft_share_by_request") if how == "per-request" else None
    if shares is None:  # one share, or a draft model (every decode drafts)
        return f"{t['spec_draft_share']:.4f}"
    return ",".join(f"{x:.4f}" for x in shares)


def queue_ms(run: Path) -> float:
    """The real engine's mean arrival-to-first-step delay (its steps.jsonl)."""
    rows = [json.loads(line) for line in (run / "steps.jsonl").read_text().splitlines()]
    delays = [q for r in rows for q in r.get("queue_s", [])]
    return 1e3 * float(np.mean(delays)) if delays else float("nan")


def print_table(rows: list[tuple[str, dict, dict, dict[str, float]]]) -> None:
    labels = [m[0] for m in METRICS] + ["E2E per request (mean |err|)"]
    print("\n| scenario | real queue ms | " + " | ".join(labels) + " |")
    print("|---" * (len(labels) + 2) + "|")
    for name, real, sim, errors in rows:
        cells = [f"{real['queue_ms']:.0f}"]
        for label, key, stat in METRICS:
            r, s = value(real, key, stat), value(sim, key, stat)
            scale = 1 if key == "output_throughput" else 1e3
            cells.append(f"{r * scale:.0f} / {s * scale:.0f} ({errors[label]:+.0%})")
        cells.append(f"{errors['E2E per request (mean |err|)']:.0%}")
        print(f"| {name} | " + " | ".join(cells) + " |")
    print("(real / simulated, ms or tok/s, (simulated - real) / real; a 'real again' row: first")
    print(" real run / second real run of the same load and seeds)")
    again = [name.endswith(AGAIN) for name, *_ in rows]
    for label in labels:
        sims = [abs(e[label]) for (*_, e), a in zip(rows, again, strict=True) if not a]
        reals = [abs(e[label]) for (*_, e), a in zip(rows, again, strict=True) if a]
        line = f"  {label}:"
        if sims:
            line += f" simulated mean |error| {np.mean(sims):.1%}, worst {max(sims):.1%}"
        if reals:
            line += f"; real run to run mean {np.mean(reals):.1%}, worst {max(reals):.1%}"
        print(line)


if __name__ == "__main__":
    main()
