"""`bench calibrate`: fit a simulated engine's step times (engine/sim/step_time.py) to the
steps a real engine logs on this machine, and save the profile `bench run --engine sim`
then finds for this model and settings."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from bench_cli.console import print_error
from engine.sim.sim_engine import cost_settings
from engine.sim.step_time import Calibrated, default_profile_path, fit, read_steps


def run_calibration_load(
    model: str, engine: dict[str, Any], out_dir: Path, num_requests: int | None, console: Console
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """profiles/calibrate.toml's phases against the bundled engine (served, as `bench run`
    runs it), a run each: their measured steps, and the resolved engine settings."""
    from bench_cli.run.execute import resolve_config, run_one
    from loadgen.profiles import load_profile

    profile = load_profile("calibrate")
    phases = profile.pop("phase", None) or [{}]
    steps: list[dict[str, Any]] = []
    config: dict[str, Any] = {}
    for i, phase in enumerate(phases, 1):
        out = out_dir / f"phase{i}"
        out.mkdir(parents=True, exist_ok=True)
        flags = {"model": model, "out": str(out), "num_requests": num_requests} | engine
        cfg = resolve_config(profile | phase, flags)
        summary = run_one(cfg, out, dashboard=False, console=console, report=False)
        steps += measured_steps(out / "steps.jsonl", summary.get("clock_t0"))
        config = summary["config"]["engine"]
    return steps, config


def measured_steps(path: Path, clock_t0: float | None) -> list[dict[str, Any]]:
    """A run's steps after its clock started: the test request and warm-up (first compiles,
    cold caches) are left out."""
    rows = read_steps(path)
    return [r for r in rows if clock_t0 is None or r["t"] >= clock_t0]


def steps_of_runs(paths: list[str]) -> tuple[list[dict[str, Any]], dict[str, Any], str | None]:
    """Steps of earlier runs (their folders or steps.jsonl files), which must share the
    cost settings; each run's config.json says which (and the GPU the last one ran on)."""
    rows: list[dict[str, Any]] = []
    settings: dict[str, Any] | None = None
    engine: dict[str, Any] = {}
    gpu = None
    for given in paths:
        path = Path(given)
        folder = path if path.is_dir() else path.parent
        steps = folder / "steps.jsonl" if path.is_dir() else path
        config = json.loads((folder / "config.json").read_text())
        engine = config.get("engine") or {}
        gpus = (config.get("hardware") or {}).get("gpus") or [{}]
        gpu = gpus[0].get("name")
        if engine.get("simulated"):
            raise ValueError(f"{given}: a simulated run; calibrate on a real one")
        these = cost_settings(engine)
        if settings is not None and these != settings:
            raise ValueError(f"{given}: other engine settings ({these}) than {settings}")
        settings = these
        summary = folder / "summary.json"
        t0 = json.loads(summary.read_text()).get("clock_t0") if summary.is_file() else None
        rows += measured_steps(steps, t0)
    return rows, engine, gpu


def calibrate(
    model: str,
    engine_flags: dict[str, Any],
    from_runs: list[str],
    out: str | None,
    num_requests: int | None,
    console: Console,
) -> int:
    from bench_cli.export import run_dir

    try:
        gpu = None  # this machine's, if the engine ran on one
        if from_runs:
            rows, engine, gpu = steps_of_runs(from_runs)
            source = from_runs
        else:
            run = run_dir(None, "calibrate")
            console.print(f"calibration load on the real engine ({escape(model)}): {run}/")
            rows, engine = run_calibration_load(model, engine_flags, run, num_requests, console)
            source = [str(run)]
        settings = cost_settings(engine)
        profile = fit(rows, model, "local", source=source)
        profile.settings = settings
        profile.roofline = roofline_efficiency(rows, model, engine, profile.gap_s, gpu, console)
        profile.device = profile.roofline["device"]  # local, or the GPU's spec
        path = Path(out) if out else default_profile_path(model, settings)
        if path is None:
            raise ValueError("the cache is off (SERVEBENCH_CACHE_DIR=0): give --out")
        profile.save(path)
    except (ValueError, OSError, KeyError) as e:
        print_error(console, str(e))
        return 2
    show(profile, console)
    console.print(f"profile: {escape(str(path))}", highlight=False, soft_wrap=True)
    return 0


def roofline_efficiency(
    rows: list[dict[str, Any]],
    model: str,
    engine: dict[str, Any],
    gap_s: float,
    gpu: str | None,
    console: Console,
) -> dict[str, Any]:
    """The roofline's efficiencies on the device the steps ran on (a GPU by its built-in spec,
    named by `gpu` or found on this machine; a CPU by this machine's measured peaks), for
    simulating other models there."""
    from dataclasses import asdict

    from bench_cli.device_peak import local_sim_peak
    from engine.config import EngineConfig
    from engine.model.shapes import model_shape
    from engine.sim.efficiency_fit import fit_efficiency
    from engine.sim.hardware import builtin_device, gpu_device_name, local_device
    from engine.sim.sim_engine import step_model_for
    from loadgen.sim_setup import LOCAL_MEMORY

    if engine.get("device") == "cuda":
        device = builtin_device(gpu_device_name(gpu))
    else:
        with console.status("measuring this machine's peaks (once a machine) ..."):
            device = local_device(local_sim_peak(engine.get("dtype")), LOCAL_MEMORY)
    keys = {k: engine.get(k) for k in ("dtype", "quantization", "tensor_parallel_size")}
    config = EngineConfig.from_kwargs(model, **{k: v for k, v in keys.items() if v is not None})
    config.cache.kv_cache_dtype = engine.get("cache", {}).get("kv_cache_dtype") or config.dtype
    roofline = step_model_for("roofline", model_shape(model), config, device)
    eff, err = fit_efficiency(rows, roofline, gap_s)  # type: ignore[arg-type]
    return {"device": device.name, "efficiency": asdict(eff), "error": err}


def show(profile: Calibrated, console: Console) -> None:
    fit = profile.fit
    table = Table(title=f"Calibrated step times: {profile.model_name} on this machine")
    table.add_column("term")
    for kind in ("decode-only steps", "steps with prefill"):
        table.add_column(kind, justify="right")
    terms = (profile.decode, profile.prefill)
    rows = [
        ("c0 (per step)", [f"{t.c0 * 1e3:.2f} ms" for t in terms]),
        ("c_tok (per token above the knee)", [f"{t.c_tok * 1e3:.3f} ms" for t in terms]),
        ("knee (tokens)", [f"{t.knee:g}" for t in terms]),
        ("bends (ms per token below 2/4/8/16/64)",
         ["/".join(f"{c * 1e3:.2f}" for c in t.c_bend) for t in terms]),
        ("c_seq (per sequence)", [f"{t.c_seq * 1e3:.3f} ms" for t in terms]),
        ("c_ctx (per decode context token)", [f"{t.c_ctx * 1e6:.3f} us" for t in terms]),
        ("c_pair (per prefill attention pair)", [f"{t.c_pair * 1e9:.3f} ns" for t in terms]),
        ("steps fitted", [str(fit["steps"] - fit["prefill_steps"]), str(fit["prefill_steps"])]),
        ("mean |error| per step", [_pct(fit["decode_mean_abs_rel_err"]),
                                   _pct(fit["prefill_mean_abs_rel_err"])]),
    ]  # fmt: skip
    for term, values in rows:
        table.add_row(term, *values)
    console.print(table)
    console.print(
        f"gap between steps {profile.gap_s * 1e3:.2f} ms; all steps: mean |error| "
        f"{fit['mean_abs_rel_err']:.1%}, p90 {fit['p90_abs_rel_err']:.1%}",
        highlight=False,
    )
    if profile.roofline:
        e = profile.roofline["efficiency"]
        console.print(
            f"roofline on {profile.roofline['device']} (for other models: --sim-cost-model "
            f"roofline --sim-profile this): compute {e['compute']:.2f}, memory "
            f"{e['memory']:.2f}, prefill attention {e['attention']:.3f} of peak, "
            f"{e['overhead_s'] * 1e3:.2f} ms a step (+{e['prefill_overhead_s'] * 1e3:.2f} ms "
            f"with prefill); mean |error| "
            f"{profile.roofline['error']:.1%}",
            highlight=False,
        )


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.1%}"
