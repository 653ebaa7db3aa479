"""The memory claims: paging (1) and FP8 (5). Both hold a KV budget fixed and keep the engine
saturated, so the number of sequences it batches is set by memory, not by the load."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bench_cli.claims.claim import Claim, Scale
from bench_cli.claims.evidence import Point, kv_waste, peak, time_mean
from bench_cli.claims.verdict import (
    FAILS,
    HOLDS,
    PARTLY,
    Finding,
    Part,
    at_least,
    chart,
    factor,
    finding,
    pct,
    ratio,
    times,
    unmeasurable,
)


def paging_sweep(scale: Scale) -> dict[str, Any]:
    # max_len reserves ceil(max_model_len / 16) blocks a request: 4 requests fill the pool;
    # requests are a few hundred tokens, so paging fits several times more.
    return scale.profile(
        "claim1-paging",
        max_model_len=scale.pick(1024, 2048),
        num_kv_blocks=scale.pick(256, 512),
        max_num_seqs=32,
        concurrency=scale.pick(24, 32),
        num_requests=scale.pick(32, 48),
        input_len=scale.pick("uniform:32:160", "uniform:64:448"),
        output_len=scale.pick("uniform:16:64", "uniform:16:128"),
        sweep={"kv_reservation": ["max_len", "paged"]},
    )


def judge_paging(points: list[Point], scale: Scale, folder: Path) -> Finding:
    by = {p.value("kv_reservation"): p for p in points}
    if set(by) != {"max_len", "paged"}:
        return unmeasurable(f"the sweep finished {sorted(by)}, not both reservations")
    figures: dict[str, Any] = {}
    for name, p in by.items():
        block = p.engine.get("cache", {}).get("block_size", 16)
        figures[name] = {
            "mean_running": time_mean(p.steps, "running"),
            "peak_running": peak(p.steps, "running"),
            "kv_waste": kv_waste(p.steps, block),
            "output_throughput": p.summary["output_throughput"],
            "num_kv_blocks": p.engine.get("cache", {}).get("num_kv_blocks"),
            "max_model_len": p.engine.get("max_model_len"),
        }
    waste = figures["max_len"]["kv_waste"]
    batch = ratio(figures["paged"]["mean_running"], figures["max_len"]["mean_running"])
    speed = ratio(figures["paged"]["output_throughput"], figures["max_len"]["output_throughput"])
    figures |= {"batch_factor": batch, "throughput_factor": speed}
    waste_verdict = at_least(waste, 0.60, 0.06)
    parts = [
        Part("KV wasted under max-length reservation", pct(waste), ">= 60 %", waste_verdict),
        Part("larger batches with paging", times(batch), ">= 3.6x (4x)", factor(batch, 4)),
    ]
    m = figures["max_len"]
    why = (
        f"same {m['num_kv_blocks']} KV blocks and saturating closed loop; max-length reservation "
        f"holds {m['max_model_len']} tokens a request; waste is the share of reserved KV "
        f"holding no token, batch the mean running sequences over busy time; paging served "
        f"{times(speed)} the output tokens/s. Both depend on max_model_len against the "
        "requests' lengths."
    )
    names = ["max_len", "paged"]
    charts = [
        chart(
            "Sequences batched at the same KV memory",
            "sequences",
            names,
            {k: [figures[n][f"{k}_running"] for n in names] for k in ("mean", "peak")},
        ),
        chart(
            "Reserved KV memory holding no token",
            "% of reserved",
            names,
            {"waste": [100 * (figures[n]["kv_waste"] or 0) for n in names]},
        ),
    ]
    return finding(parts, figures, why, charts)


PAGING = Claim(
    id="1",
    slug="paging",
    title="PagedAttention vs max-length reservation",
    brief=(
        "Standard serving pre-allocates contiguous memory for the maximum sequence length, "
        "wasting 60-80 % of KV memory; PagedAttention enables up to 4x larger concurrent "
        "batches on the same memory."
    ),
    thresholds={"kv_waste": ">= 60 % holds, > 6 % partly", "batch_factor": ">= 3.6x holds"},
    sweep=paging_sweep,
    judge=judge_paging,
    minutes=(0.4, 4.5),
)


FP8_LABELS = ("16-bit", "fp8")


def fp8_sweep(scale: Scale) -> dict[str, Any]:
    # The budget holds ~16 sequences with a 16-bit KV cache, ~32 in fp8; 48 stay in flight.
    return scale.profile(
        "claim5-fp8",
        concurrency=48,
        num_requests=scale.pick(64, 64),
        input_len=scale.pick("128", "256"),
        output_len=scale.pick("32", "64"),
        max_num_seqs=64,
        kv_cache_memory_gb=scale.pick(0.0006, 0.11),
        sweep={
            "precision": [
                {"label": FP8_LABELS[0], "kv_cache_dtype": "bfloat16"},
                {"label": FP8_LABELS[1], "quantization": "fp8", "kv_cache_dtype": "fp8"},
            ]
        },
    )


FP8_VARIANTS = {
    "model dtype": {},
    "fp8 weights + fp8 KV": {"quantization": "fp8", "kv_cache_dtype": "fp8"},
}


def measure_fp8_accuracy(scale: Scale) -> dict[str, Any]:
    from bench_cli.claims.accuracy import compare

    return compare(scale.model, FP8_VARIANTS, max_tokens=scale.pick(256, None))


def judge_fp8(points: list[Point], scale: Scale, folder: Path) -> Finding:
    by = {p.value("precision"): p for p in points}
    if set(by) != set(FP8_LABELS):
        return unmeasurable(f"the sweep finished {sorted(by)}, not both precisions")
    figures: dict[str, Any] = {}
    for name, p in by.items():
        memory = p.engine.get("memory") or {}
        figures[name] = {
            "num_kv_blocks": p.engine.get("cache", {}).get("num_kv_blocks"),
            "weight_bytes": memory.get("weight_bytes"),
            "dtype": p.engine.get("dtype"),
            "mean_running": time_mean(p.steps, "running"),
            "output_throughput": p.summary["output_throughput"],
        }
    base, fp8 = figures[FP8_LABELS[0]], figures[FP8_LABELS[1]]
    kv = ratio(fp8["num_kv_blocks"], base["num_kv_blocks"])
    weights = ratio(base["weight_bytes"], fp8["weight_bytes"])  # both as held in this dtype
    batch = ratio(fp8["mean_running"], base["mean_running"])
    speed = ratio(fp8["output_throughput"], base["output_throughput"])
    accuracy = json.loads((folder / "measured.json").read_text())
    plain, quant = accuracy["model dtype"], accuracy["fp8 weights + fp8 KV"]
    ppl_rise = quant["perplexity"] / plain["perplexity"] - 1
    agree = quant["top1_agreement"]
    figures |= {
        "kv_factor": kv,
        "weight_factor": weights,
        "batch_factor": batch,
        "throughput_factor": speed,
        "accuracy": accuracy,
        "perplexity_rise": ppl_rise,
    }
    lossless = ppl_rise <= 0.01 and agree >= 0.99
    loss_verdict = HOLDS if lossless else (PARTLY if ppl_rise <= 0.05 else FAILS)
    parts = [
        Part("KV memory cut", times(kv), ">= 1.8x", factor(kv, 2)),
        Part("weight memory cut", times(weights), ">= 1.8x", factor(weights, 2)),
        Part("sequences batched", times(batch), ">= 1.8x", factor(batch, 2)),
        Part("throughput", times(speed), ">= 1.8x", factor(speed, 2)),
        Part(
            "loss",
            f"perplexity {pct(ppl_rise)} higher, top-1 agreement {pct(agree)}",
            "<= 1 % and >= 99 % (partly: perplexity <= 5 %)",
            loss_verdict,
        ),
    ]
    why = (
        f"same KV memory budget (16-bit KV vs fp8), saturating closed loop; weights as held "
        f"by the two servers, the model computing in {base['dtype']} (fp8 keeps embeddings "
        "and the LM head in it: a 16-bit model would save less than a float32 one); "
        "perplexity and top-1 agreement with the model in its own dtype over "
        f"{plain['tokens']} held-out tokens through the paged cache."
    )
    if scale.quick:
        why += " Quick: a tiny random model, whose perplexity says nothing about a real one."
    factors = {"KV blocks": kv, "weights": weights, "sequences": batch}
    factors["output tok/s"] = speed
    charts = [
        chart(
            "fp8 over 16-bit, at one KV budget",
            "factor",
            list(factors),
            {"fp8": list(factors.values())},
        ),
        chart(
            "Accuracy against the model in its own dtype",
            "perplexity",
            list(accuracy),
            {"perplexity": [a["perplexity"] for a in accuracy.values()]},
        ),
    ]
    return finding(parts, figures, why, charts)


FP8 = Claim(
    id="5",
    slug="fp8",
    title="FP8 weights and KV cache",
    brief=(
        "FP8 cuts weight and KV memory in half, allowing twice as many requests; "
        "2x throughput with zero measurable loss."
    ),
    thresholds={
        "memory, batch, throughput factors": ">= 1.8x holds (2x), > 1.1x partly",
        "zero measurable loss": "perplexity <= 1 % higher and top-1 agreement >= 99 %",
    },
    sweep=fp8_sweep,
    judge=judge_fp8,
    measure=measure_fp8_accuracy,
    not_simulated="its loss half needs the model's weights, and a simulation has none",
    minutes=(0.5, 5.5),
)
