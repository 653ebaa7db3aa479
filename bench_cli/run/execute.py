"""`bench run`: resolve the config, start the target, run the load with a progress bar, print
and write the results. Exit codes: 0 done (some requests may have failed: the summary says),
1 nothing measured (the test request failed, no request succeeded, or the first ones all failed
alike and the run stopped early) or a worker process (--workers) died, 2 bad input, 3 INVALID
(the schedule was not kept), 128 + the signal's number when interrupted (130 for Ctrl-C)."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

from bench_cli.console import print_error
from bench_cli.export import environment, run_dir, write_json, write_summary
from bench_cli.local_server import LocalServer, ServerStartError
from bench_cli.run.interrupts import Interrupted, raising_on_signals
from bench_cli.tables import print_result, sim_title
from loadgen.arrivals import arrival_process
from loadgen.config import RunConfig
from loadgen.machine_cpu import steal_warning
from loadgen.profiles import build_config, load_profile
from loadgen.redact import printable, redact_url

BUNDLED_MODEL = "smollm2-135m"


def execute(
    profile: str, flags: dict[str, Any], dashboard: bool, console: Console, explain: bool = False
) -> int:
    with raising_on_signals():
        return _execute(profile, flags, dashboard, console, explain)


def _execute(
    profile: str, flags: dict[str, Any], dashboard: bool, console: Console, explain: bool
) -> int:
    from engine.model.sources import ModelLoadError

    out_dir: Path | None = None
    try:
        data = load_profile(profile)
        grid = data.pop("sweep", None)  # a sweep profile's base load runs as one point
        try:
            cfg = resolve_config(data, flags)
        except ValueError as e:
            if not grid:
                raise
            keys = ", ".join(f"--{k.replace('_', '-')}" for k in grid)
            raise ValueError(
                f"{e} (profile {profile!r} is a sweep profile: its [sweep] table sets {keys}; "
                f"run it with `bench sweep --profile {profile}`, or give {keys} here)"
            ) from None
        if cfg.save_vllm_json:
            from bench_cli.run.vllm_json import check_vllm_json_path

            check_vllm_json_path(cfg.save_vllm_json, cfg.out, cfg.overwrite_vllm_json)
        out_dir = run_dir(cfg.out, cfg.name)
        summary = run_one(cfg, out_dir, dashboard, console)
    except Interrupted as e:  # outside the load (which handles signals itself)
        kept = f"; what was written is in {escape(str(out_dir))}/" if out_dir else ""
        console.print(
            f"[yellow]interrupted[/] by {e.name} while starting or finishing the run{kept}",
            highlight=False,
        )
        return e.exit_code
    except ServerStartError as e:
        print_error(console, f"the bundled engine did not start: {e}")
        return 2
    except (ValueError, OSError, ModelLoadError) as e:
        print_error(console, printable(e))
        return 2
    target = redact_url(cfg.base_url) if cfg.base_url else f"bundled {cfg.model}"
    if cfg.engine_kind == "sim":
        target = sim_title(summary.get("config", {}).get("engine", {}), cfg.model)
    if cfg.naive_batch is not None:
        target = f"{cfg.model}, transformers generate, static batches of {cfg.naive_batch}"
    print_result(console, summary, f"{cfg.name}: {target}, {_load_text(cfg)}")
    if explain:
        from bench_cli.run.explain import explain as explain_lines

        for line in explain_lines(summary, _load_text(cfg)):
            console.print(escape(line), highlight=False)
    report = out_dir / "report.html"
    opened = f" · open {report} in a browser" if report.is_file() else ""
    console.print(
        f"results: {escape(str(out_dir))}/{escape(opened)}", highlight=False, soft_wrap=True
    )
    return exit_code(summary)  # print_result said why, when it is not 0


INVALID_EXIT = 3  # finished, results written, but the load offered was not the one asked for


def exit_code(summary: dict[str, Any]) -> int:
    """Worst first: a signal, nothing measured, an INVALID run (the load generator fell behind
    its schedule: every number is of another load, so CI must not take it for a pass)."""
    if summary["interrupted"]:  # the shell's convention: 128 + the signal's number
        return 128 + (summary["stop_signal"] or signal.SIGINT)
    if summary["completed"] == 0 or summary.get("worker_failure"):  # a worker process died
        return 1
    return INVALID_EXIT if not summary.get("valid", True) else 0


def resolve_config(profile: dict[str, Any], flags: dict[str, Any]) -> RunConfig:
    from engine.config import engine_arg_names

    cfg = build_config(profile, flags, engine_arg_names())
    if cfg.base_url:  # with or without /v1, as vLLM's bench takes it; config.json says which
        from loadgen.endpoints import resolve_base_url

        cfg.base_url = resolve_base_url(cfg.base_url, cfg.api_key)
    cfg.model = cfg.model or _default_model(cfg)
    return cfg


def run_one(
    cfg: RunConfig, out_dir: Path, dashboard: bool, console: Console, report: bool = True
) -> dict[str, Any]:
    """Plan, start the target, connect, measure (loadgen's three steps), then write the
    results (and report.html); the summary."""
    from loadgen.virtual_loop import without_cyclic_gc

    with without_cyclic_gc() if cfg.engine_kind == "sim" else contextlib.nullcontext():
        return _run_one(cfg, out_dir, dashboard, console, report)


def _run_one(
    cfg: RunConfig, out_dir: Path, dashboard: bool, console: Console, report: bool
) -> dict[str, Any]:
    from bench_cli.run.tokenizer_choice import resolve_tokenizer
    from loadgen.benchmark import Target, connect, measure
    from loadgen.plan import build_plan
    from loadgen.server_info import ServerInfo

    server_info = _detected_server(cfg, console) if cfg.base_url else None
    tokenizer, tokenizer_name = resolve_tokenizer(cfg, server_info, console)
    built = build_plan(cfg, tokenizer)
    for note in built.notes:
        console.print(f"[yellow]note:[/] {escape(note)}", highlight=False)
    workers = _auto_workers(cfg, built.plan.offsets, console)
    from loadgen.worker_slots import fit_workers

    split = fit_workers(cfg)  # --concurrency's slots over the workers (fewer workers than C)
    if split is not None:
        console.print(f"[yellow]note:[/] {escape(split)}", highlight=False)
    config: dict[str, Any] = {"run": cfg.to_dict(), "tokenizer": tokenizer_name, **built.info}
    if workers is not None:
        config["workers_auto"] = workers
    if split is not None:
        config["workers_split"] = split
    if isinstance(server_info, ServerInfo):  # an external server: what it said it is
        config["server"] = server_info.describe()
    config["load"] = _load_text(cfg)  # in words, for the report's subtitle
    server: LocalServer | None = None
    try:
        local_peak = None
        if cfg.base_url:
            target = Target.external(cfg.base_url)
        elif cfg.engine_kind == "sim":
            target = Target.simulated(f"simulated {cfg.model} on {cfg.sim_device or 'local'}")
            if (cfg.sim_device or "local") == "local":
                local_peak = _device_peak(
                    {"device": "cpu", "dtype": cfg.engine.get("dtype")}, console
                )
        elif cfg.naive_batch is not None:  # the baseline: no server, no engine
            target = Target.naive(cfg.naive_batch)
        elif cfg.in_process:
            target = Target.in_process()
        else:
            server = LocalServer(
                cfg.model, cfg.engine, out_dir / "server.log", out_dir / "steps.jsonl"
            )
            with console.status(f"starting the bundled engine ({cfg.model}) ..."):
                server.start()
            target = Target.bundled(server.base_url, server.proc.pid if server.proc else None)
            config["engine"] = server.engine_config()
        backend = connect(cfg, target, tokenizer, local_peak)
        config["target"] = target.describe()
        if cfg.in_process or cfg.engine_kind == "sim":
            config["engine"] = backend.engine_info()  # type: ignore[attr-defined]
        elif cfg.naive_batch is not None:
            config["naive"] = backend.info()  # type: ignore[attr-defined]
            if ignored := config["naive"]["ignored_engine_settings"]:
                names = ", ".join(f"--{k.replace('_', '-')}" for k in ignored)
                console.print(
                    f"[yellow]note:[/] the naive baseline has no scheduler or KV cache: "
                    f"{escape(names)} ignored",
                    highlight=False,
                )
        if cfg.engine_kind == "sim":  # the simulated device's peaks (spec sheet or measured)
            config["device_peak"] = backend.device_peak()  # type: ignore[attr-defined]
            given = {"--sim-acceptance": cfg.sim_acceptance}
            given["--sim-draft-share"] = cfg.sim_draft_share
            unused = [flag for flag, value in given.items() if value is not None]
            if unused and not config["engine"]["speculative_config"]:
                console.print(
                    f"[yellow]note:[/] {', '.join(unused)} unused: this run does not speculate",
                    highlight=False,
                )
        elif config.get("engine"):  # engine steps to divide by it: see bench_cli/device_peak.py
            config["device_peak"] = _device_peak(config["engine"], console)
        write_json(out_dir / "config.json", config | environment())
        # A simulation's loop runs on virtual time: its progress line is drawn on wall time
        view = None
        if dashboard:
            view = (_sim_view if cfg.engine_kind == "sim" else _live_view)(cfg, console)
        summary, outcome = measure(cfg, built, backend, target, out_dir, view)
        if target.kind in ("bundled", "bundled-in-process"):
            _advise_on_steal(summary, config.get("engine") or {})
        summary["config"] = config
        # An engine started for this run and not warmed: its first requests pay one-off costs.
        summary["cold_start"] = not cfg.base_url and cfg.warmup == 0
        write_summary(out_dir, summary)  # before the server's (slow) shutdown
        if cfg.save_vllm_json:
            from bench_cli.run.vllm_json import write_vllm_json

            write_vllm_json(cfg.save_vllm_json, summary, outcome.records)
    finally:
        if server is not None:
            server.stop()
    if report:
        from bench_cli.report.run import run_report

        run_report(out_dir, records=outcome.records)
    return summary


def _auto_workers(cfg: RunConfig, offsets: Any, console: Console) -> dict[str, Any] | None:
    """--workers auto: the N picked, and why, said before the run (and kept in config.json)."""
    from dataclasses import asdict

    from loadgen.worker_count import resolve_workers

    if cfg.workers != "auto":
        return None
    with console.status("--workers auto: measuring what one worker keeps ..."):
        choice = resolve_workers(cfg, offsets)
    assert choice is not None
    style = "yellow" if choice.needed > choice.workers else "cyan"
    console.print(f"[{style}]{escape(choice.reason())}[/]", highlight=False)
    return asdict(choice) | {"reason": choice.reason()}


def _detected_server(cfg: RunConfig, console: Console) -> Any:
    """The external server's kind and version as it says them (loadgen/server_info.py)."""
    from loadgen.server_info import detect_server

    assert cfg.base_url is not None
    info = detect_server(cfg.base_url, cfg.model, cfg.api_key)
    console.print(f"server: {escape(printable(info.text()))}", highlight=False)
    return info


def _default_model(cfg: RunConfig) -> str:
    if not cfg.base_url:
        return BUNDLED_MODEL
    from loadgen.endpoints import served_models

    models = served_models(cfg.base_url, cfg.api_key)
    if not models:
        raise ValueError(f"{redact_url(cfg.base_url)}/models lists no model; pass --model")
    return models[0]


def _load_text(cfg: RunConfig) -> str:
    if cfg.classes:
        text = "; ".join(c.describe() for c in cfg.classes)
        return text + (f", cap {cfg.concurrency}" if cfg.concurrency else "")
    process = arrival_process(cfg.arrival)
    if process.replays:  # a trace: its file says it all
        return process.describe(cfg.flat())
    per_s = "conversations/s" if cfg.turns is not None else "req/s"  # what the arrivals are
    if cfg.closed_loop:
        text = f"closed loop, concurrency {cfg.concurrency}"
    elif cfg.ramp_up_strategy:
        text = (
            f"{cfg.arrival} {cfg.ramp_up_strategy} ramp {cfg.ramp_up_start_rps:g}"
            f"->{cfg.ramp_up_end_rps:g} {per_s}"
        )
    else:
        text = process.describe(cfg.flat(), per_s)
    if cfg.concurrency and not cfg.closed_loop:
        text += f", cap {cfg.concurrency}"
    if cfg.turns is not None:
        text += f", {cfg.turns} turns" + (f", {cfg.think_time:g} s think" if cfg.think_time else "")
    return text


def _live_view(cfg: RunConfig, console: Console) -> Any:
    """The dashboard, started by the run once its runner and telemetry exist."""
    from bench_cli.dashboard import Dashboard

    title = f"{cfg.name}: {_load_text(cfg)}"
    rate = cfg.rate or None  # a process without a rate (a trace) refuses --rate
    if cfg.classes:  # the mix's rate: the classes' together
        rate = sum(c.rate or 0.0 for c in cfg.classes)

    def start(runner: Any, telemetry: Any) -> asyncio.Task:
        return asyncio.create_task(Dashboard(runner, telemetry, title, rate, console).run())

    return start


def _sim_view(cfg: RunConfig, console: Console) -> Any:
    """A simulated run's progress line (bench_cli/run/sim_progress.py)."""
    from bench_cli.run.sim_progress import SimProgress

    def start(runner: Any, telemetry: Any) -> asyncio.Task:
        return asyncio.create_task(SimProgress(runner, cfg.name, console).run())

    return start


def _device_peak(engine: dict[str, Any], console: Console) -> dict[str, Any] | None:
    """The peak of the device the bundled engine runs on (this machine), for the report's
    utilization, or that a simulation of this machine computes with (in the dtype "auto"
    resolves to): cached per machine, measured (a few seconds) the first time."""
    import torch

    from bench_cli.device_peak import device_peak
    from engine.resolve import resolve_dtype

    device = engine.get("device") or "auto"
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    name = resolve_dtype(engine.get("dtype") or "auto", torch.device(device))
    dtype = torch.bfloat16 if name == "bfloat16" else torch.float32
    with console.status("measuring this device's peak FLOP/s and bandwidth (once a machine) ..."):
        try:
            return device_peak(device, dtype)
        except (RuntimeError, ValueError) as e:
            console.print(f"[yellow]note:[/] device peak not measured: {escape(str(e))}")
            return None


def _advise_on_steal(summary: dict[str, Any], engine: dict[str, Any]) -> None:
    """The host-steal warning, for a bundled engine on OpenMP's threads that sleep between a
    step's regions: what held its decode on such a host (each wake waits for the host). An
    engine on its kernels' own pool (its config says so) waits for no sleeping thread."""
    from engine import omp_wait  # no torch; a server we start inherits the policy it set

    if engine.get("cpu_pool_threads", 1) > 1:
        return
    policy = omp_wait.state.policy
    if policy != "passive" and not policy.startswith("spin "):
        return  # it spins as libgomp does, or the user chose
    warnings, steal = summary["warnings"], steal_warning(summary["telemetry"])
    if steal in warnings:
        warnings[warnings.index(steal)] = (
            f"{steal}. The bundled engine's threads sleep between parallel regions ({policy}), "
            "and on a busy host each wake waits for it: SERVEBENCH_OMP_PASSIVE=0 held its "
            "decode on such a host (docs/results/2026-12-07-host-steal.md)"
        )
