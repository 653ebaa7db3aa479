"""Builds the simulated engine a run asks for (`--engine sim`): the model's shape, the device,
the step-time model (a calibration profile, or the roofline) and the engine's own settings."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from engine.config import EngineConfig
from engine.model.shapes import model_shape
from engine.sim.clock import VirtualClock
from engine.sim.hardware import DeviceSpec, builtin_device, local_device
from engine.sim.sim_engine import (
    SimEngine,
    cost_settings,
    resolve_sim_config,
    size_gpu_kv_cache,
    step_model_for,
)
from engine.sim.speculation import Acceptance, DraftShare
from engine.sim.step_time import Calibrated, default_profile_path
from loadgen.config import RunConfig
from loadgen.sim_backend import SimBackend

LOCAL_MEMORY = 24e9  # what "memory" means for this machine's KV sizing: unused (2 GiB default)


def sim_device(cfg: RunConfig, local_peak: dict[str, Any] | None) -> DeviceSpec:
    name = (cfg.sim_device or "local").lower()
    if name != "local":
        return builtin_device(name)
    if local_peak is None:
        raise ValueError("--sim-device local needs this machine's measured peaks")
    return local_device(local_peak, LOCAL_MEMORY)


def sim_backend(cfg: RunConfig, tokenizer: Any, local_peak: dict[str, Any] | None) -> SimBackend:
    assert cfg.model is not None
    if tokenizer is None:
        raise ValueError("--engine sim builds prompts with a tokenizer: pass --tokenizer")
    config = EngineConfig.from_kwargs(cfg.model, **cfg.engine)
    model = model_shape(cfg.model)
    device = sim_device(cfg, local_peak)
    resolve_sim_config(config, device)
    size_gpu_kv_cache(config, model, device)
    profile = calibration(cfg, config, device)
    kind = cfg.sim_cost_model or ("calibrated" if profile is not None else "roofline")
    step_model = step_model_for(kind, model, config, device, profile)
    clock = VirtualClock()
    acceptance = None if cfg.sim_acceptance is None else Acceptance.parse(cfg.sim_acceptance)
    engine = SimEngine(
        config, model, step_model, clock, acceptance, DraftShare.parse(cfg.sim_draft_share)
    )
    return SimBackend(engine, clock, tokenizer, device, cfg.endpoint)


def calibration(cfg: RunConfig, config: EngineConfig, device: DeviceSpec) -> Calibrated | None:
    """The profile asked for (--sim-profile), else the default one of this model and
    settings when simulating this machine; None when there is none."""
    if cfg.sim_profile:
        return Calibrated.load(cfg.sim_profile)
    if device.name != "local" or cfg.sim_cost_model == "roofline":
        return None
    assert cfg.model is not None
    path = default_profile_path(cfg.model, cost_settings(config.to_dict()))
    if path is None or not Path(path).is_file():
        if cfg.sim_cost_model == "calibrated":
            raise ValueError(
                f"no calibration profile for {cfg.model} with these settings here ({path}): "
                f"run `bench calibrate --model {cfg.model}` with the same engine flags"
            )
        return None
    return Calibrated.load(path)
