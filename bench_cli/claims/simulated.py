"""`bench claims --engine sim`: the claims on the simulated engine, with their loads scaled to
the simulated model and device."""

from __future__ import annotations

from typing import Any

from bench_cli.claims.claim import FULL_MODEL, QUICK_MODEL, Simulation
from engine.model.cost import StepShape

# The step that sizes the claims' loads: decodes of 8 sequences at 256 tokens of context (the
# claims' loads run a few to a few dozen sequences of a few hundred tokens).
REFERENCE_BATCH, REFERENCE_CONTEXT = 8, 256


def simulation(
    quick: bool,
    model: str | None,
    device: str,
    cost_model: str | None,
    profile: str | None,
    tp: int,
    local_peak: dict[str, Any] | None,
) -> Simulation:
    """The simulation asked for; on another device or with another model than the claims'
    own, the rates are scaled by how much faster its decode step is than the claims' model's
    on this machine (both by the roofline; this machine's peaks measured)."""
    reference = QUICK_MODEL if quick else FULL_MODEL
    factor = 1.0
    if device != "local" or (model or reference) != reference or tp > 1:
        if local_peak is None:
            raise ValueError("simulated claims elsewhere need this machine's measured peaks")
        here = _decode_step(reference, "local", 1, local_peak)
        there = _decode_step(model or reference, device, tp, local_peak)
        factor = here / there
    return Simulation(device, cost_model, profile, tp, round(factor, 4))


def _decode_step(model: str, device: str, tp: int, local_peak: dict[str, Any]) -> float:
    from engine.config import EngineConfig
    from engine.model.shapes import model_shape
    from engine.sim.hardware import builtin_device, local_device
    from engine.sim.sim_engine import resolve_sim_config, step_model_for
    from loadgen.sim_setup import LOCAL_MEMORY

    spec = local_device(local_peak, LOCAL_MEMORY) if device == "local" else builtin_device(device)
    config = EngineConfig.from_kwargs(model, tensor_parallel_size=tp)
    resolve_sim_config(config, spec)
    roofline = step_model_for("roofline", model_shape(model), config, spec)
    b, ctx = REFERENCE_BATCH, REFERENCE_CONTEXT
    return roofline.step_time(StepShape(0, b, b, b * ctx, b * ctx, 0, b))
