"""`bench run`'s options; the run itself is run/execute.py's."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from bench_cli.arrival_options import arrival_options
from bench_cli.console import console
from bench_cli.engine_options import engine_options
from bench_cli.sim_options import (
    EngineKind,
    SimAcceptance,
    SimCostModel,
    SimDevice,
    SimDraftShare,
    SimProfile,
)

Opt = typer.Option


@engine_options(unset=True, prefix="engine: ")
@arrival_options
def run(
    profile: Annotated[str, Opt(help="profile name (profiles/NAME.toml) or path")] = "default",
    name: Annotated[str | None, Opt(help="run name (in the results folder name)")] = None,
    base_url: Annotated[
        str | None, Opt(help="an external OpenAI-compatible server, e.g. http://127.0.0.1:8000/v1")
    ] = None,
    model: Annotated[
        str | None, Opt(help="served model name (external) or model to serve (bundled)")
    ] = None,
    endpoint: Annotated[str | None, Opt(help="completions | chat")] = None,
    tokenizer: Annotated[str | None, Opt(help="tokenizer for prompts and counts")] = None,
    api_key: Annotated[str | None, Opt(help="bearer token for the server")] = None,
    in_process: Annotated[
        bool | None, Opt(help="bundled engine in this process, no HTTP (quick runs)")
    ] = None,
    naive_batch: Annotated[
        int | None,
        Opt(
            help="the naive baseline instead of our engine: transformers generate in this "
            "process, static batches of N (1: one request at a time); needs transformers"
        ),
    ] = None,
    engine_kind: EngineKind = None,
    sim_device: SimDevice = None,
    sim_cost_model: SimCostModel = None,
    sim_profile: SimProfile = None,
    sim_acceptance: SimAcceptance = None,
    sim_draft_share: SimDraftShare = None,
    arrival: Annotated[str | None, Opt(help="the processes, listed from their registry")] = None,
    rate: Annotated[float | None, Opt(help="requests per second (open loop)")] = None,
    concurrency: Annotated[
        int | None, Opt(help="closed loop alone; with --rate, a cap on requests in flight")
    ] = None,
    trace: Annotated[str | None, Opt(help="trace file for --arrival trace")] = None,
    trace_format: Annotated[str | None, Opt(help="mooncake | azure | burstgpt | jsonl")] = None,
    trace_model: Annotated[str | None, Opt(help="BurstGPT: keep only this model")] = None,
    ramp_up_strategy: Annotated[
        str | None, Opt(help="linear | exponential: the rate moves from start to end")
    ] = None,
    ramp_up_start_rps: Annotated[float | None, Opt(help="ramp-up: first request's rate")] = None,
    ramp_up_end_rps: Annotated[float | None, Opt(help="ramp-up: last request's rate")] = None,
    num_requests: Annotated[int | None, Opt(help="requests to send")] = None,
    duration: Annotated[float | None, Opt(help="stop sending after S seconds")] = None,
    warmup: Annotated[int | None, Opt(help="warm-up requests, left out of the metrics")] = None,
    seed: Annotated[int | None, Opt(help="seeds arrivals and prompts")] = None,
    workers: Annotated[
        str | None,
        Opt(
            help="processes sending the load to an HTTP server (default 1), or auto (from "
            "the rate and a measurement at start); --concurrency's slots are split over them"
        ),
    ] = None,
    ray_address: Annotated[
        str | None,
        Opt(help="run the --workers as Ray actors on this cluster (ADDR, or local)"),
    ] = None,
    input_len: Annotated[
        str | None, Opt(help="N | uniform:lo:hi | normal:mean:std | lognormal:mean:sigma")
    ] = None,
    input_len_after_template: Annotated[
        bool | None,
        Opt(
            "--input-len-after-template",
            help="chat: --input-len is the prompt's length after the chat template (its "
            "tokens, from the tokenizer's template, come off each prompt)",
        ),
    ] = None,
    output_len: Annotated[str | None, Opt(help="as --input-len")] = None,
    dataset: Annotated[str | None, Opt(help="sharegpt:PATH")] = None,
    shared_prefix_len: Annotated[
        int | None, Opt(help="tokens of a shared system prompt before each prompt")
    ] = None,
    num_prefix_groups: Annotated[int | None, Opt(help="distinct shared prefixes")] = None,
    ignore_eos: Annotated[bool | None, Opt(help="ask for exactly the output length")] = None,
    n: Annotated[int | None, Opt(help="completions per prompt (parallel sampling)")] = None,
    turns: Annotated[
        str | None,
        Opt(
            help="multi-turn: turns per conversation (N or uniform:lo:hi); --num-requests and "
            "--rate then count conversations"
        ),
    ] = None,
    think_time: Annotated[
        float | None, Opt(help="multi-turn: seconds between a reply and the next turn")
    ] = None,
    traffic_class: Annotated[
        list[str] | None,
        Opt("--class", help="a traffic class (its keys listed from the registry)"),
    ] = None,
    temperature: Annotated[
        float | None, Opt(help="sampling temperature (default 0: greedy)")
    ] = None,
    top_p: Annotated[float | None, Opt(help="nucleus sampling (default: not sent)")] = None,
    top_k: Annotated[int | None, Opt(help="top-k sampling (default: not sent)")] = None,
    header: Annotated[
        list[str] | None, Opt(help="'NAME: VALUE' sent with every request (repeatable)")
    ] = None,
    extra_body: Annotated[
        str | None, Opt(help="JSON merged into every request body, e.g. '{\"min_p\": 0.1}'")
    ] = None,
    slo: Annotated[str | None, Opt(help="goodput SLOs, e.g. ttft=0.5,tpot=0.05,e2e=10")] = None,
    max_p99_lag_ms: Annotated[
        float | None, Opt(help="p99 schedule lag above which the run is invalid")
    ] = None,
    timeout: Annotated[float | None, Opt(help="per-request timeout in seconds")] = None,
    telemetry_interval: Annotated[
        float | None, Opt(help="seconds between telemetry samples (GPU, CPU, /metrics)")
    ] = None,
    out: Annotated[str | None, Opt(help="results folder (default results/<time>-<name>)")] = None,
    save_vllm_json: Annotated[
        str | None, Opt(help="also write the result as `vllm bench serve --save-result` does")
    ] = None,
    overwrite_vllm_json: Annotated[
        bool | None, Opt(help="let --save-vllm-json replace an existing file")
    ] = None,
    no_dashboard: Annotated[bool, Opt("--no-dashboard", help="no live progress display")] = False,
    explain: Annotated[
        bool, Opt("--explain", help="end with two lines on what the numbers mean (make demo)")
    ] = False,
    *,
    engine: dict[str, Any],
    arrival_params: dict[str, Any],
) -> None:
    """Benchmark a server under load: the bundled engine (default) or any OpenAI-compatible
    one (--base-url); prints TTFT/ITL/TPOT/E2E, throughput and goodput, writes a results folder."""
    flags = {
        k: v
        for k, v in locals().items()
        if k not in ("profile", "no_dashboard", "header", "traffic_class", "explain")
        and k not in ("engine", "arrival_params")
    }
    flags |= engine | arrival_params
    flags["headers"] = header or None
    flags["classes"] = traffic_class or None
    from bench_cli.run.execute import execute

    code = execute(profile, flags, dashboard=not no_dashboard, console=console, explain=explain)
    raise typer.Exit(code)
