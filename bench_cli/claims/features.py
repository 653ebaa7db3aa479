"""The claims about engine features beyond batching and memory: sharing prompt pages between
parallel samples (7a), priority scheduling (7b), speculative decoding (7c), and tensor
parallelism (7d), which only a simulation can show here (one device, no GPUs)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bench_cli.claims.claim import FULL_MODEL, QUICK_MODEL, Claim, Scale
from bench_cli.claims.evidence import Point, peak
from bench_cli.claims.verdict import (
    FAILS,
    HOLDS,
    UNMEASURABLE,
    Finding,
    Part,
    at_least,
    chart,
    finding,
    pct,
    ratio,
    times,
    unmeasurable,
)

N = 8


def sharing_sweep(scale: Scale) -> dict[str, Any]:
    return scale.profile(
        "claim7a-sharing",
        concurrency=2,
        num_requests=scale.pick(4, 6),
        input_len=scale.pick("256", "384"),
        output_len="24",
        temperature=0.8,
        n=N,
        sweep={"enable_prefix_caching": [True, False]},
    )


def judge_sharing(points: list[Point], scale: Scale, folder: Path) -> Finding:
    by = {p.value("enable_prefix_caching"): p for p in points}
    if set(by) != {True, False}:
        return unmeasurable("the sweep did not finish both with and without sharing")
    figures: dict[str, Any] = {}
    for shared, p in by.items():
        figures["shared" if shared else "copied"] = {
            "peak_kv_blocks": peak(p.steps, "kv_blocks_used"),
            "prefill_tokens": sum(s["prefill_tokens"] for s in p.steps),
            "output_throughput": p.summary["output_throughput"],
        }
    on, off = figures["shared"], figures["copied"]
    compute = ratio(off["prefill_tokens"], on["prefill_tokens"])
    memory = ratio(off["peak_kv_blocks"], on["peak_kv_blocks"])
    figures |= {"prefill_factor": compute, "kv_factor": memory}
    parts = [
        Part(
            "prompt tokens computed, cut",
            times(compute),
            f">= {N // 2}x",
            at_least(compute, N / 2, 1.1),
        ),
        Part("peak KV blocks cut", times(memory), ">= 2x", at_least(memory, 2.0, 1.1)),
    ]
    why = (
        f"n={N} samples of each prompt, prefix caching (the engine's page sharing) on vs off: "
        "prompt tokens computed (engine steps) and the peak KV blocks in use. The brief gives "
        "no number: we call half of n (a prompt computed about once, each sample recomputing "
        "its last block, as vLLM does) and 2x less KV memory 'shares'."
    )
    names = ["shared", "copied"]
    charts = [
        chart(
            "Peak KV blocks in use",
            "blocks",
            names,
            {"peak": [figures[n]["peak_kv_blocks"] for n in names]},
        ),
        chart(
            "Prompt tokens computed",
            "tokens",
            names,
            {"prefill": [figures[n]["prefill_tokens"] for n in names]},
        ),
    ]
    return finding(parts, figures, why, charts)


SHARING = Claim(
    id="7a",
    slug="sharing",
    title="Parallel samples share prompt pages",
    brief="Parallel rollouts share prompt pages.",
    thresholds={"prefill_factor": f">= {N // 2}x (n={N})", "kv_factor": ">= 2x"},
    sweep=sharing_sweep,
    judge=judge_sharing,
    minutes=(0.3, 3.0),
)


def priority_sweep(scale: Scale) -> dict[str, Any]:
    # An interactive class beside a background class that saturates the engine.
    interactive = {
        "name": "interactive",
        "arrival": "poisson",
        "rate": scale.pick(4.0, 0.5),
        "num_requests": 10,
        "input_len": "uniform:16:48",
        "output_len": "16",
        "priority": 0,
    }
    background = {
        "name": "background",
        "arrival": "poisson",
        "rate": scale.pick(16.0, 1.5),
        "num_requests": 30,
        "input_len": "uniform:256:512",
        "output_len": "96",
        "priority": 1,
    }
    return scale.profile(
        "claim7b-priority",
        num_requests=20,
        max_num_seqs=4,
        **{"class": [interactive, background]},
        sweep={"scheduling_policy": ["fcfs", "priority"]},
    )


def judge_priority(points: list[Point], scale: Scale, folder: Path) -> Finding:
    by = {p.value("scheduling_policy"): p for p in points}
    if set(by) != {"fcfs", "priority"}:
        return unmeasurable("the sweep did not finish both policies")
    figures = {
        name: {
            "interactive_ttft_p99_s": p.klass("interactive")["ttft_s"]["p99"],
            "background_ttft_p99_s": p.klass("background")["ttft_s"]["p99"],
            "output_throughput": p.summary["output_throughput"],
        }
        for name, p in by.items()
    }
    before = figures["fcfs"]["interactive_ttft_p99_s"]
    after = figures["priority"]["interactive_ttft_p99_s"]
    cut = 1 - after / before if before and after is not None else None
    figures["cut"] = cut
    part = Part("interactive TTFT p99 cut", pct(cut), ">= 50 %", at_least(cut, 0.5, 0.05))
    why = (
        f"an interactive class (priority 0) beside a saturating background class: its TTFT "
        f"p99 {after:.2f} s under priority vs {before:.2f} s first-come-first-served. The "
        "brief gives no number: we call a 50 % cut 'prioritizes'."
    )
    names = ["fcfs", "priority"]
    series = {
        c: [figures[n][f"{c}_ttft_p99_s"] for n in names] for c in ("interactive", "background")
    }
    charts = [chart("TTFT p99 by class", "s", names, series)]
    return finding([part], figures, why, charts)


PRIORITY = Claim(
    id="7b",
    slug="priority",
    title="Priority scheduling",
    brief="Prioritizes interactive streams.",
    thresholds={"cut": ">= 50 % holds, > 5 % partly (the brief gives no number)"},
    sweep=priority_sweep,
    judge=judge_priority,
    minutes=(0.3, 6.0),
)

COPY_EDIT = Path(__file__).resolve().parents[2] / "profiles" / "data" / "copy-edit.json"


def speculative_sweep(scale: Scale) -> dict[str, Any]:
    # One request at a time (decode latency, where speculation should pay) on copy-heavy
    # prompts, where n-gram lookup finds what comes next.
    ngram = {"method": "ngram", "num_speculative_tokens": 4}
    return scale.profile(
        "claim7c-speculative",
        concurrency=1,
        num_requests=scale.pick(3, 8),
        dataset=f"sharegpt:{COPY_EDIT}",
        output_len=scale.pick("48", "96"),
        ignore_eos=True,
        endpoint="chat",
        sweep={"speculation": [{"label": "off"}, {"label": "ngram", "speculative_config": ngram}]},
    )


def judge_speculative(points: list[Point], scale: Scale, folder: Path) -> Finding:
    by = {p.value("speculation"): p for p in points}
    if set(by) != {"off", "ngram"}:
        return unmeasurable("the sweep did not finish both with and without speculation")
    figures: dict[str, Any] = {
        name: {
            "tpot_p50_s": p.summary["tpot_s"]["p50"],
            "output_throughput": p.summary["output_throughput"],
            "acceptance_rate": p.summary["telemetry"].get("spec_acceptance_rate"),
            "tokens_per_draft": p.summary["telemetry"].get("spec_mean_acceptance_length"),
        }
        for name, p in by.items()
    }
    cut = ratio(figures["off"]["tpot_p50_s"], figures["ngram"]["tpot_p50_s"])
    figures["tpot_factor"] = cut
    part = Part("TPOT p50 cut", times(cut), ">= 1.2x", at_least(cut, 1.2, 1.05))
    accepted = figures["ngram"]["acceptance_rate"]
    why = (
        "one request at a time copying or proofreading a paragraph (profiles/data/"
        "copy-edit.json), greedy, n-gram prompt lookup with 4 draft tokens vs none: TPOT p50 "
        f"{figures['off']['tpot_p50_s'] * 1e3:.0f} ms off, "
        f"{figures['ngram']['tpot_p50_s'] * 1e3:.0f} ms speculating ({pct(accepted)} of draft "
        "tokens accepted). The brief gives no number: we call a 1.2x shorter TPOT 'cuts'. "
        "At saturation, and with drafts that are rarely right, it costs instead "
        "(profiles/speculative.toml shows both)."
    )
    names = ["off", "ngram"]
    charts = [
        chart("TPOT p50", "s", names, {"TPOT": [figures[n]["tpot_p50_s"] for n in names]}),
        chart(
            "Output throughput",
            "tok/s",
            names,
            {"tok/s": [figures[n]["output_throughput"] for n in names]},
        ),
    ]
    return finding([part], figures, why, charts)


SPECULATIVE = Claim(
    id="7c",
    slug="speculative",
    title="Speculative decoding",
    brief="Speculative decoding cuts decode latency.",
    thresholds={"tpot_factor": ">= 1.2x (the brief gives no number)"},
    sweep=speculative_sweep,
    judge=judge_speculative,
    not_simulated="a simulation is given (--sim-acceptance) the acceptance this claim measures",
    minutes=(0.5, 4.0),
)

# 141 GB of bf16 weights: more than one A100, H100 or H200 holds (a B200 holds it alone)
TP_MODEL = "meta-llama/Llama-3.1-70B"
TP_REQUESTS = (8, 32)  # quick, full


def _tp_model(scale: Scale) -> str:
    """The model the claim is about, one beyond one device, unless --model names another."""
    return TP_MODEL if scale.model in (QUICK_MODEL, FULL_MODEL) else scale.model


def fewest_devices(scale: Scale) -> dict[str, Any]:
    """The fewest simulated devices (a power of two) the model's weights fit on, found as
    `bench run --engine sim` finds it (the same sizing, which refuses what does not fit), and
    what one device said."""
    from engine.config import EngineConfig
    from engine.model.shapes import model_shape
    from engine.sim.hardware import builtin_device
    from engine.sim.sim_engine import resolve_sim_config, size_gpu_kv_cache, weight_bytes

    assert scale.sim is not None, "7d runs simulated only"
    name, device = _tp_model(scale), scale.sim.device
    model = model_shape(name)
    out: dict[str, Any] = {"model": name, "device": device, "fewest_devices": 1}
    if device == "local":  # this machine's memory is not split into devices
        return out
    spec = builtin_device(device)
    refusals = []
    for tp in (1, 2, 4, 8, 16):
        config = EngineConfig.from_kwargs(name, tensor_parallel_size=tp)
        resolve_sim_config(config, spec)
        try:
            size_gpu_kv_cache(config, model, spec)
        except ValueError as e:
            refusals.append(str(e))
            continue
        out |= {"fewest_devices": tp, "weights_gb": weight_bytes(model, config) / 1e9}
        out |= {"device_memory_gb": spec.memory_bytes / 1e9, "refused": refusals}
        out["kv_cache_gb"] = config.cache.kv_cache_memory_gb
        return out
    raise ValueError(f"{name} fits on no 16 x {device}")


def tensor_parallel_sweep(scale: Scale) -> dict[str, Any]:
    # A few users at a time (latency, not throughput): the fewest devices the weights fit
    # on, then twice as many.
    tp = fewest_devices(scale)["fewest_devices"]
    return scale.profile(
        "claim7d-tensor-parallel",
        model=_tp_model(scale),
        concurrency=4,
        num_requests=scale.pick(*TP_REQUESTS),
        input_len="512",
        output_len=scale.pick("32", "128"),
        sweep={"tensor_parallel_size": [tp, 2 * tp]},
    )


def judge_tensor_parallel(points: list[Point], scale: Scale, folder: Path) -> Finding:
    fit = json.loads((folder / "measured.json").read_text())
    tp = fit["fewest_devices"]
    by = {p.value("tensor_parallel_size"): p for p in points}
    if set(by) != {tp, 2 * tp}:
        return unmeasurable(f"the sweep did not finish on both {tp} and {2 * tp} devices")
    few, more = by[tp], by[2 * tp]
    asked = scale.pick(*TP_REQUESTS)
    served = few.summary["completed"] == asked and few.summary["failed"] == 0
    figures: dict[str, Any] = {"fit": fit}
    for n, p in ((tp, few), (2 * tp, more)):
        figures[f"tp{n}"] = {
            "tpot_p50_s": p.summary["tpot_s"]["p50"],
            "ttft_p50_s": p.summary["ttft_s"]["p50"],
            "output_throughput": p.summary["output_throughput"],
            "completed": p.summary["completed"],
        }
    device, what = fit["device"], f"{fit['model'].split('/')[-1]} served beyond one device"
    if device == "local":
        beyond = Part(what, "n/a", "refused on one", UNMEASURABLE)
        where = "this machine's memory is not split into devices: simulate a GPU (--sim-device)"
    elif tp == 1:
        beyond = Part(what, "fits one", "refused on one", UNMEASURABLE)
        where = f"{fit['model']} fits one {device}: give a bigger --model"
    else:
        held = f"{few.summary['completed']}/{asked} requests on {tp} x {device}"
        beyond = Part(what, held, "all", HOLDS if served else FAILS)
        where = (
            f"{fit['model']}'s {fit['weights_gb']:.0f} GB of weights: refused on "
            f"{tp // 2 or 1} x {device} ({fit['refused'][-1]}); served on {tp}"
        )
    cut = ratio(figures[f"tp{tp}"]["tpot_p50_s"], figures[f"tp{2 * tp}"]["tpot_p50_s"])
    figures["tpot_factor"] = cut
    parts = [
        beyond,
        Part(
            f"TPOT p50 cut, {tp} -> {2 * tp} devices",
            times(cut),
            ">= 1.3x",
            at_least(cut, 1.3, 1.05),
        ),
    ]
    why = (
        f"simulated on {device}: {where}. Four users at a time, 512-token prompts: TPOT p50 "
        f"{figures[f'tp{tp}']['tpot_p50_s'] * 1e3:.1f} ms on {tp}, "
        f"{figures[f'tp{2 * tp}']['tpot_p50_s'] * 1e3:.1f} ms on {2 * tp} (each device reads "
        "half the weights; the all-reduces cost back part of it). The brief gives no number: "
        "we call a 1.3x shorter TPOT 'cuts'."
    )
    names = [f"{tp} devices", f"{2 * tp} devices"]
    charts = [
        chart(
            "TPOT p50",
            "s",
            names,
            {"TPOT": [figures[f"tp{n}"]["tpot_p50_s"] for n in (tp, 2 * tp)]},
        )
    ]
    return finding(parts, figures, why, charts)


TENSOR_PARALLEL = Claim(
    id="7d",
    slug="tensor-parallel",
    title="Tensor parallelism",
    brief="Tensor parallelism serves models beyond one device and cuts latency.",
    thresholds={
        "beyond_one_device": "a model one device refuses is served on the fewest that hold it",
        "tpot_factor": ">= 1.3x from those devices to twice as many (the brief gives no number)",
    },
    sweep=tensor_parallel_sweep,
    judge=judge_tensor_parallel,
    measure=fewest_devices,
    model=_tp_model,
    only_simulated=(
        "this machine has one device: tensor_parallel_size=2 runs here as 2 processes "
        "splitting its CPU cores, which shows the all-reduce cost "
        "(benchmarks/tensor_parallel.py), not serving beyond one device"
    ),
    minutes=(0.2, 0.5),
)
