"""`bench profile`'s analysis and the whole command's work: FLOPs and bytes of each category
against the device's measured peaks, the step's memory floor, and profile.json."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

import torch

from bench_cli.device_peak import measure_peak
from bench_cli.export import environment, run_dir, write_json
from bench_cli.profile.capture import COMPILED_REST, Shape, capture
from engine.config import EngineConfig
from engine.engine import LLMEngine
from engine.model.cost import matmul_params


def _module_bytes(module: torch.nn.Module) -> int:
    tensors = [*module.parameters(), *module.buffers()]
    return sum(t.numel() * t.element_size() for t in tensors)


def analyse(engine: LLMEngine, shape: Shape, result: dict[str, Any], peak: dict[str, Any]) -> dict:
    """FLOPs and bytes of the categories that have them (analytic, as in
    bench_cli/claims/utilization.py: the weights a step reads once, the KV its attention reads),
    their rates against the measured peaks, and the step's memory floor: the bytes it must read
    (weights, KV) over the device's read bandwidth."""
    model = engine.runner.model
    cfg = model.config
    tokens = shape.batch + shape.prefill
    p, start = shape.prefill, result["prefill_start"]
    # Query-key pairs: each decode reads its context; a chunk's i-th query its own prefix.
    pairs = result["decode_context"] + (p * start + p * (p + 1) / 2 if p else 0)
    keys_read = result["decode_context"] + (start + p if p else 0)
    kv_token_bytes = engine.stats()["kv_block_bytes"] / engine.config.cache.block_size
    rows = shape.batch  # the prefill chunk never ends its prompt: no row of its is sampled
    linear_bytes = sum(_module_bytes(getattr(m, n)) for m, n in model._layer_linears())
    head_bytes = _module_bytes(model.lm_head) if rows else 0
    costs = {
        "linears": (2.0 * matmul_params(cfg) * tokens, linear_bytes),
        "attention": (
            4.0 * cfg.num_layers * cfg.num_heads * cfg.head_dim * pairs,
            kv_token_bytes * (keys_read + tokens),
        ),
        "LM head": (2.0 * cfg.hidden_size * cfg.vocab_size * rows, head_bytes),
    }
    took = result["category_s"]
    if took[COMPILED_REST] and not took["attention"]:  # decode steps: attention is compiled in
        costs[COMPILED_REST] = costs.pop("attention")
    rates = {}
    for category, (flops, moved) in costs.items():
        took = result["category_s"][category]
        rates[category] = {
            "flops": flops,
            "bytes": moved,
            "flops_per_s": flops / took if took else None,
            "bytes_per_s": moved / took if took else None,
        }
    floor_bytes = sum(moved for _, moved in costs.values())
    floor_s = floor_bytes / peak["peak_read_bytes_per_s"]
    return {
        "rates": rates,
        "floor_bytes": floor_bytes,
        "floor_s": floor_s,
        "floor_ratio": result["step_s"] / floor_s,
    }


def run_profile(model: str, shape: Shape, options: dict[str, Any], out: str | None) -> dict:
    """Build the engine, measure this device's peaks, capture and analyse; writes trace.json
    and profile.json in the folder (default results/<time>-profile) and returns the report."""
    shape.validate()
    engine = LLMEngine(EngineConfig.from_kwargs(model, **{**options, **shape.engine_args()}))
    folder = run_dir(out, "profile")
    result = capture(engine, shape, folder)
    device = engine.runner.device
    peak = measure_peak(device.type, engine.runner.dtype)
    report = {
        "shape": asdict(shape),
        "engine": engine.config.to_dict(),
        "environment": environment(),
        "peak": peak,
        **result,
        "analysis": analyse(engine, shape, result, peak),
        "trace": str(folder / "trace.json"),
    }
    write_json(folder / "profile.json", report)
    return report
