"""The `bench` command line."""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Iterator
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from bench_cli.arrival_options import arrival_options
from bench_cli.engine_options import engine_options
from engine.serving.access_log import QUIET_PATHS
from engine.serving.limits import API_KEY_ENV, ServerLimits

app = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__, rich_markup_mode=None)
# Without a terminal (CI logs, a server's log file) rich would wrap at 80 columns, folding
# tables into unreadable cells; logs can be wide.
console = Console(width=None if sys.stdout.isatty() else 200)

DEFAULT_PROMPTS = [
    "The capital of France is",
    "Write a Python function that checks whether a number is prime.",
    "Explain in two sentences why the sky is blue.",
    "List five fruits that are red:",
]


@app.callback()
def main() -> None:
    """servebench: benchmark and profile LLM serving."""


def engine_line(engine: Any) -> str:
    """Weights, KV cache and attention path as set up, for the start-up line: what fp8 saves
    and whether the compiled decode attention is on are visible there."""
    c = engine.config
    kv_gib = engine.stats()["kv_block_bytes"] * engine.kv.num_blocks / 2**30
    held = "fp8 linears" if c.quantization else c.dtype
    spec = c.speculative_config
    speculation = ""
    if spec is not None:
        detail = (
            f"n-grams {spec.prompt_lookup_min}-{spec.prompt_lookup_max}"
            if spec.method == "ngram"
            else f"first {spec.num_draft_layers} layers"
        )
        speculation = (
            f" · speculative {spec.method} ({detail}), {spec.num_speculative_tokens} tokens"
        )
    parallel = ""
    if c.tensor_parallel_size > 1:
        parallel = f" · tensor parallel {c.tensor_parallel_size} (weights: rank 0's shard)"
    return (
        f"weights {engine.weight_bytes / 2**20:.0f} MiB ({held}; "
        f"{engine.weight_bytes_bf16 / 2**20:.0f} MiB in bfloat16) · KV cache "
        f"{engine.kv.num_blocks} blocks x {c.cache.block_size} tokens, {kv_gib:.2f} GiB "
        f"({c.cache.kv_cache_dtype}) · {c.attention_backend} kernels, decode attention "
        f"{engine.decode_attention}, forward {engine.model_forward}, linears {engine.linears}"
        f"{speculation}{parallel}"
    )


@contextlib.contextmanager
def engine_errors(command: str) -> Iterator[None]:
    """A setting the engine refuses is one red line and exit code 2, not a traceback."""
    try:
        yield
    except (ValueError, TypeError) as e:
        console.print(f"[red]bench {command}: {escape(str(e))}[/red]")
        raise typer.Exit(2) from None


@app.command()
@engine_options()
def generate(
    prompts: Annotated[
        list[str] | None, typer.Argument(help="prompts (default: a few demos)")
    ] = None,
    model: str = "smollm2-135m",
    max_tokens: int = 48,
    temperature: float = 0.0,
    seed: int = 0,
    chat: Annotated[bool, typer.Option(help="wrap each prompt in the chat template")] = True,
    *,
    engine: dict[str, Any],
) -> None:
    """Generate offline with the bundled engine and show its KV-cache and batching stats."""
    from engine import LLM, SamplingParams

    t0 = time.perf_counter()
    with engine_errors("generate"):
        llm = LLM(model, seed=seed, **engine)
    load_s = time.perf_counter() - t0
    texts: list[str] | list[list[int]] = prompts or DEFAULT_PROMPTS
    tokenizer = llm.get_tokenizer()
    if chat and tokenizer is not None and tokenizer.chat_template:
        texts = [tokenizer.encode_chat([{"role": "user", "content": p}]) for p in texts]
    params = SamplingParams(max_tokens=max_tokens, temperature=temperature, seed=seed)
    # Untimed: a process's first steps pay one-off costs (oneDNN primitives, CUDA's lazily
    # loaded kernels) that are not the engine's speed. Greedy: it draws no random numbers.
    llm.generate(texts, SamplingParams(max_tokens=2, temperature=0.0))
    llm.llm_engine.reset_prefix_cache()  # the timed run computes its prompts, as a cold one
    warm = llm.llm_engine.stats()
    steps0, preempted0 = warm["num_steps"], warm["num_preemptions"]
    t0 = time.perf_counter()
    outputs = llm.generate(texts, params)
    gen_s = time.perf_counter() - t0

    table = Table(
        title=f"{model} ({engine['dtype']}, {engine['batching']} batching)", show_lines=True
    )
    for col in ("prompt", "output", "tokens in/out", "TTFT s", "E2E s", "finish"):
        table.add_column(col, overflow="fold")
    for prompt, out in zip(prompts or DEFAULT_PROMPTS, outputs, strict=True):
        m, c = out.metrics, out.outputs[0]
        ttft = (m.first_token_time or m.arrival_time) - m.arrival_time
        e2e = (m.finish_time or m.arrival_time) - m.arrival_time
        table.add_row(
            prompt,
            c.text.strip(),
            f"{len(out.prompt_token_ids)}/{len(c.token_ids)}",
            f"{ttft:.2f}",
            f"{e2e:.2f}",
            c.finish_reason or "",
        )
    console.print(table)
    stats = llm.llm_engine.stats()
    n_out = sum(len(o.outputs[0].token_ids) for o in outputs)
    paged = stats["kv_peak_bytes_used"] / 2**20
    contiguous = stats["kv_contiguous_bytes_equivalent"] / 2**20
    from engine.ops.cpu_decode_attention import compiled_afresh

    cold = " (cold: includes compiling the CPU decode attention)" if compiled_afresh() else ""
    console.print(
        f"load {load_s:.1f} s{cold} · generate {gen_s:.2f} s after a warm-up · "
        f"{n_out / gen_s:.1f} output tok/s · "
        f"{stats['num_steps'] - steps0} steps · {stats['num_preemptions'] - preempted0} preemptions"
    )
    console.print(engine_line(llm.llm_engine))
    from loadgen.telemetry import spec_counts

    spec = spec_counts(warm, stats)
    if spec:  # the timed run's, as the line above
        console.print(
            f"speculative decoding: {spec['spec_accepted_tokens']} of "
            f"{spec['spec_draft_tokens']} draft tokens accepted "
            f"({spec['spec_acceptance_rate']:.0%}), {spec['spec_mean_acceptance_length']:.2f} "
            "tokens per verified draft"
        )
    console.print(
        f"KV cache: peak {stats['kv_peak_blocks_used']}/{stats['kv_blocks_total']} blocks of "
        f"{stats['kv_block_size']} tokens = {paged:.1f} MiB paged, vs {contiguous:.1f} MiB if each "
        f"request had reserved the full context ({llm.llm_engine.max_model_len} tokens) "
        f"contiguously"
    )


@app.command()
@engine_options()
def serve(
    model: str = "smollm2-135m",
    host: str = "127.0.0.1",
    port: int = 8000,
    served_model_name: Annotated[str | None, typer.Option(help="name in the API")] = None,
    api_key: Annotated[
        str | None,
        typer.Option(
            envvar=API_KEY_ENV,
            show_envvar=True,
            help="require 'Authorization: Bearer KEY' on the /v1 routes (not /health, /metrics); "
            "the variable keeps the key out of `ps`",
        ),
    ] = None,
    max_queue: Annotated[int, typer.Option(help="waiting requests beyond this get 429")] = 256,
    max_body_bytes: Annotated[
        int, typer.Option(min=1, help="a request body larger than this gets 413")
    ] = ServerLimits.max_body_bytes,
    body_timeout: Annotated[
        float, typer.Option(min=0.001, help="seconds a whole request body may take to arrive: 408")
    ] = ServerLimits.body_timeout_s,
    max_body_reads: Annotated[
        int, typer.Option(min=1, help="request bodies received at once; beyond it: 503")
    ] = ServerLimits.max_body_reads,
    step_log: Annotated[
        str | None, typer.Option(help="append one JSON line per engine step to this file")
    ] = None,
    disable_access_log_for_endpoints: Annotated[
        str,
        typer.Option(help="paths left out of the access log, comma-separated ('': log all)"),
    ] = ",".join(QUIET_PATHS),
    *,
    engine: dict[str, Any],
) -> None:
    """Serve the bundled engine over an OpenAI-compatible HTTP API."""
    import logging

    from engine.config import EngineConfig
    from engine.engine import LLMEngine
    from engine.serving.access_log import parse_paths
    from engine.serving.async_engine import AsyncLLMEngine
    from engine.serving.server import build_app, run

    if os.environ.get(API_KEY_ENV) == "" and api_key is None:  # click reads "" as unset
        api_key = ""
    if api_key is not None and not api_key:  # before minutes of loading, not after
        raise typer.BadParameter(
            "the API key is empty (an open server is started without --api-key and without "
            f"{API_KEY_ENV})",
            param_hint=f"--api-key / {API_KEY_ENV}",
        )
    limits = ServerLimits(max_body_bytes, body_timeout, max_body_reads)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    with engine_errors("serve"):
        llm = LLMEngine(EngineConfig.from_kwargs(model, **engine))
    llm.log_steps(step_log)
    app = build_app(AsyncLLMEngine(llm), served_model_name or model, api_key, max_queue, limits)
    console.print(llm.startup.line(), highlight=False)
    console.print(f"serving {model} on http://{host}:{port}/v1 · {engine_line(llm)}")
    run(app, host, port, parse_paths(disable_access_log_for_endpoints))


Opt = typer.Option

# The simulated engine's flags, shared by run and sweep.
EngineKind = Annotated[
    str | None,
    Opt(
        "--engine",
        help="bundled (the real engine) | sim: its scheduler and KV cache on a virtual "
        "clock, each step timed by a cost model (no weights; any model, any device)",
    ),
]
SimDevice = Annotated[
    str | None, Opt(help="sim: a100 | h100 | h200 | b200 | local (this machine, default)")
]
SimCostModel = Annotated[
    str | None,
    Opt(help="sim: calibrated (a bench calibrate profile) | roofline (default without one)"),
]
SimProfile = Annotated[
    str | None, Opt(help="sim: a calibration profile (default: bench calibrate's path)")
]
SimDraftShare = Annotated[
    str | None,
    Opt(
        help="sim, speculative decoding: the share of decodes the proposer finds a draft for "
        "(n-gram lookup misses the rest; default 1), or per-request shares, 0.1,0.9,1 (each "
        "request takes one: n-gram hits cluster in requests; a run's summary gives them)"
    ),
]
SimAcceptance = Annotated[
    str | None,
    Opt(
        help="sim, speculative decoding: the verifier's acceptance of draft tokens, a rate "
        "per token (0.7) or vLLM's rates per draft position (0.8,0.6,0.45)"
    ),
]


@app.command()
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
            help="processes sending the load (default 1), or auto (from the rate and a "
            "measurement at start): an open-loop schedule to an HTTP server"
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


@app.command()
def sweep(
    profile: Annotated[
        str | None,
        Opt(help="sweep profile: a run profile with a [sweep] table (with --rates: any profile)"),
    ] = None,
    rates: Annotated[
        str | None,
        Opt(
            help="the load axis: rates such as 1,2,4 (replace the profile's), or auto:N as "
            "guidellm's sweep: a synchronous run (concurrency 1), a throughput run (every "
            "request at once) and N-2 rates spaced linearly between their achieved req/s"
        ),
    ] = None,
    base_url: Annotated[
        str | None,
        Opt(help="sweep the load against an external server (with --serve-cmd: where it listens)"),
    ] = None,
    slo_search: Annotated[
        str | None,
        Opt(
            help="LO:HI[:STEPS]: per setting, the highest rate with --slo-target of requests "
            "in the profile's SLO, by bisection between LO and HI req/s (STEPS midpoints, "
            "default 5)"
        ),
    ] = None,
    slo_target: Annotated[
        float | None,
        Opt(
            help="share of requests in SLO that makes a load served, 0 < x <= 1 (default 0.9): "
            "the SLO knee, --slo-search and the verdict use it"
        ),
    ] = None,
    serve_cmd: Annotated[
        str | None,
        Opt(
            help="start this server for every run, e.g. 'vllm serve M --max-num-seqs "
            "{max_num_seqs}': {KEY} filled from the sweep's grid, {port} with a free port; "
            "its output in the point's server.log; stopped (its process group) after the run"
        ),
    ] = None,
    ready_url: Annotated[
        str | None,
        Opt(help="with --serve-cmd: ready when this answers 200 (default /health, /v1/models)"),
    ] = None,
    ready_timeout: Annotated[
        float, Opt(help="with --serve-cmd: seconds to wait for the server to be ready")
    ] = 600.0,
    after_point_cmd: Annotated[
        str | None, Opt(help="with --serve-cmd: a shell command run after each point's runs")
    ] = None,
    model: Annotated[str | None, Opt(help="served model name or bundled model")] = None,
    api_key: Annotated[str | None, Opt(help="bearer token for the server")] = None,
    num_requests: Annotated[
        int | None, Opt(help="requests a point (replaces the profile's; not with a sweep axis)")
    ] = None,
    duration: Annotated[
        float | None, Opt(help="stop sending after S seconds a point (as --num-requests)")
    ] = None,
    rate: Annotated[
        float | None,
        Opt(
            help="one request rate for every point (refused where rate is an axis: "
            "--rates replaces the axis)"
        ),
    ] = None,
    repeat: Annotated[int, Opt(help="runs per point (fresh server each): mean, std, 95% CI")] = 1,
    resume: Annotated[str | None, Opt(help="a sweep folder: skip its finished points")] = None,
    name: Annotated[str | None, Opt(help="sweep name (in the folder name)")] = None,
    out: Annotated[str | None, Opt(help="sweep folder (default results/<time>-<name>)")] = None,
    no_dashboard: Annotated[bool, Opt("--no-dashboard", help="no live progress display")] = False,
    engine_kind: EngineKind = None,
    sim_device: SimDevice = None,
    sim_cost_model: SimCostModel = None,
    sim_profile: SimProfile = None,
    sim_acceptance: SimAcceptance = None,
    sim_draft_share: SimDraftShare = None,
) -> None:
    """Run one load list against a grid of engine settings, a fresh server per point; writes
    sweep.csv and prints which setting is best at each load. `--rates auto:N` finds the loads
    itself (`bench sweep --base-url URL --rates auto:10`: the default profile's requests)."""
    from bench_cli.sweep.runner import run_sweep

    if repeat < 1:
        console.print("[bold red]error:[/] --repeat must be >= 1")
        raise typer.Exit(2)
    if profile is None and rates is None and slo_search is None:
        console.print("[bold red]error:[/] give --profile (a sweep profile) and/or --rates")
        raise typer.Exit(2)
    serve = None
    if serve_cmd is not None:
        from bench_cli.sweep.serve_cmd import ServeCommand

        serve = ServeCommand(serve_cmd, base_url, ready_url, ready_timeout, after_point_cmd)
    elif ready_url is not None or after_point_cmd is not None:
        console.print("[bold red]error:[/] --ready-url and --after-point-cmd go with --serve-cmd")
        raise typer.Exit(2)
    flags = {"base_url": base_url, "model": model, "api_key": api_key, "name": name, "out": out}
    flags |= {"engine_kind": engine_kind, "sim_device": sim_device}
    flags |= {"sim_cost_model": sim_cost_model, "sim_profile": sim_profile}
    flags |= {"sim_acceptance": sim_acceptance, "sim_draft_share": sim_draft_share}
    flags |= {"num_requests": num_requests, "duration": duration, "rate": rate}
    code = run_sweep(
        profile or "default",
        flags,
        repeat,
        resume,
        not no_dashboard,
        console,
        rates,
        serve,
        slo_search,
        slo_target,
    )
    raise typer.Exit(code)


@app.command()
@engine_options(
    (
        "dtype",
        "quantization",
        "kv_cache_dtype",
        "enforce_eager",
        "attention_backend",
        "tensor_parallel_size",
        "max_num_seqs",
    ),
    unset=True,
    prefix="engine: ",
)
def calibrate(
    model: Annotated[str, Opt(help="bundled model to measure")] = "smollm2-135m",
    from_run: Annotated[
        list[str] | None,
        Opt(help="fit to an earlier real run's steps (its folder; repeatable) instead of a load"),
    ] = None,
    out: Annotated[str | None, Opt(help="profile path (default: where --engine sim looks)")] = None,
    num_requests: Annotated[
        int | None,
        Opt(help="requests of each phase of the calibration load (profiles/calibrate.toml)"),
    ] = None,
    *,
    engine: dict[str, Any],
) -> None:
    """Fit the simulated engine's step times to this machine: run a load ramping past
    saturation on the real engine (or read --from-run folders), fit step time to the steps'
    shapes, and save the profile `bench run --engine sim` uses for this model and settings."""
    from bench_cli.calibrate import calibrate as run_calibrate

    raise typer.Exit(run_calibrate(model, engine, from_run or [], out, num_requests, console))


@app.command()
def claims(
    quick: Annotated[
        bool,
        Opt("--quick", help="the tiny random model and small loads: tests the machinery (~5 min)"),
    ] = False,
    only: Annotated[str | None, Opt(help="claims to run by id or number, e.g. 1,3,7b")] = None,
    model: Annotated[
        str | None, Opt(help="bundled model (default smollm2-135m; quick: tiny)")
    ] = None,
    base_url: Annotated[
        str | None, Opt(help="a server for the claims about servers (4); the rest need ours")
    ] = None,
    out: Annotated[str | None, Opt(help="claims folder (default results/<time>-claims)")] = None,
    resume: Annotated[str | None, Opt(help="a claims folder: skip its finished claims")] = None,
    no_dashboard: Annotated[bool, Opt("--no-dashboard", help="no live progress display")] = False,
    max_p99_lag_ms: Annotated[
        float | None,
        Opt(help="p99 schedule lag above which a run is INVALID (default 10; a busy machine)"),
    ] = None,
    engine: EngineKind = None,
    sim_device: SimDevice = None,
    sim_cost_model: SimCostModel = None,
    sim_profile: SimProfile = None,
    tensor_parallel_size: Annotated[
        int, Opt(help="sim: GPUs the simulated model is split over")
    ] = 1,
) -> None:
    """Measure the serving folklore on this machine: paging, continuous batching, chunked
    prefill, the engine vs naive serving, FP8, fused kernels, sharing and priority. Each claim
    is an ordinary sweep in its own folder; prints claim, what the brief says, what was
    measured and a verdict, and writes claims.json and claims.html. With --engine sim, the
    claims a simulation can show, predicted for any model and device, in minutes; their
    arrival rates scaled to that model and device's speed."""
    from bench_cli.claims.runner import SimFlags, run_claims

    sim = SimFlags(engine, sim_device, sim_cost_model, sim_profile, tensor_parallel_size)
    code = run_claims(
        only, quick, model, base_url, out, resume, not no_dashboard, console, sim, max_p99_lag_ms
    )
    raise typer.Exit(code)


@app.command()
@engine_options(
    (
        "dtype",
        "device",
        "quantization",
        "kv_cache_dtype",
        "enforce_eager",
        "attention_backend",
        "cuda_graphs",
        "block_size",
        "num_kv_blocks",
        "kv_cache_memory_gb",
        "load_format",
    )
)
def profile(
    model: str = "smollm2-135m",
    batch: Annotated[int, Opt(help="sequences decoding in each step")] = 8,
    context: Annotated[int, Opt(help="tokens each decoding sequence holds at the start")] = 128,
    prefill: Annotated[int, Opt(help="prompt tokens of one more request computed per step")] = 0,
    steps: Annotated[int, Opt(help="steps measured in each of the three passes")] = 10,
    warmup: Annotated[int, Opt(help="steps run before each pass, not measured")] = 3,
    out: Annotated[str | None, Opt(help="folder (default results/<time>-profile)")] = None,
    compare: Annotated[
        str | None, Opt(help="an earlier profile (folder or profile.json) to show beside")
    ] = None,
    *,
    engine: dict[str, Any],
) -> None:
    """Where an engine step's time goes: steps of one shape (decodes at a context, optionally
    beside a prefill chunk) timed by category (linears, attention, norms and activations, LM
    head, sampling, scheduling, input preparation, detokenization, the engine's Python) against
    this device's measured matmul and read peaks, with the memory floor of the step; writes
    trace.json (torch profiler, opens in Perfetto) and profile.json."""
    from bench_cli.profile import ProfileError, Shape, load_report, render, run_profile

    shape = Shape(batch, context, prefill, steps, warmup)
    options = engine
    try:
        before = load_report(compare) if compare else None  # a bad path fails before the run
        report = run_profile(model, shape, options, out)
    except (ProfileError, ValueError) as e:
        console.print(f"[red]bench profile: {escape(str(e))}[/red]")
        raise typer.Exit(2) from None
    table, lines = render(report, before)
    console.print(table)
    for line in lines:
        console.print(line)
    console.print(f"trace: {report['trace']} (open in Perfetto or chrome://tracing)")


@app.command()
def gate(
    current: Annotated[str, typer.Argument(help="run or sweep folder (or summary.json) to judge")],
    baseline: Annotated[str | None, Opt(help="run or sweep folder to compare with")] = None,
    max_regression: Annotated[
        list[str] | None, Opt(help="METRIC=PCT%, e.g. output_throughput=5% or ttft_s.p99=10%")
    ] = None,
    ratio: Annotated[
        list[str] | None,
        Opt(
            help="within a sweep: 'output_throughput[batching=continuous]/"
            "output_throughput[batching=static]>=2'"
        ),
    ] = None,
    allow_invalid: Annotated[
        bool, Opt(help="compare runs that flagged themselves INVALID (schedule not kept)")
    ] = False,
) -> None:
    """Judge a run or sweep: against a baseline (--max-regression) and/or by ratios inside
    it (--ratio). Exit 1 if anything fails, 2 on unusable input."""
    from bench_cli.gate.checks import Limit, compare, invalid_labels, noise_note
    from bench_cli.gate.ratio import Ratio
    from bench_cli.gate.results import GateInputError, load_differences, load_results

    try:
        if not max_regression and not ratio:
            raise GateInputError("nothing to check: give --max-regression and/or --ratio")
        if max_regression and baseline is None:
            raise GateInputError("--max-regression needs --baseline")
        checks, judged, warnings = [], [], []
        cur = load_results(current)
        if max_regression:
            limits = [Limit.parse(m) for m in max_regression]
            base = load_results(baseline)  # type: ignore[arg-type]
            checks += compare(cur, base, limits, allow_invalid)
            judged += [base, cur]
            if differ := load_differences(cur, base):
                warnings.append("the two were not given the same load: " + "; ".join(differ))
        if ratio:
            checks += [c for r in ratio for c in Ratio.parse(r).evaluate(cur, allow_invalid)]
            judged.append(cur)
        if allow_invalid and (
            bad := list(dict.fromkeys(w for r in judged for w in invalid_labels(r)))
        ):
            warnings.append("compared although INVALID (--allow-invalid): " + "; ".join(bad))
    except GateInputError as e:
        console.print(f"[bold red]error:[/] {escape(str(e))}", highlight=False)
        raise typer.Exit(2) from None
    title = f"gate: {current}" + (f" vs {baseline}" if baseline else "")
    table = Table(title=escape(title))
    for col in ("check", "point", "baseline / bottom", "current / top", "change", "limit", ""):
        table.add_column(col, justify="left" if col in ("check", "point") else "right")
    for c in checks:
        verdict = (
            "[yellow]noise[/]" if c.noise else "[green]pass[/]" if c.passed else "[bold red]FAIL[/]"
        )
        is_ratio = "[" in c.metric
        change = f"x{c.change:.2f}" if is_ratio else f"{c.change:+.1%}"
        table.add_row(
            escape(c.metric),
            escape(c.point),
            _number(c.baseline),
            _number(c.current),
            change if c.change == c.change else "-",  # NaN: no ratio (see the note)
            f"{c.limit:g}" if is_ratio else f"{c.limit * 100:.4g}% worse",
            verdict,
        )
    console.print(table)
    for note in dict.fromkeys(c.note for c in checks if c.note):
        console.print(f"[red]{escape(note)}[/]", highlight=False)
    if any(c.noise for c in checks):
        console.print("[yellow]noise[/]: worse than the limit, but inside both runs' 95% CIs")
    for text in warnings:
        console.print(f"[yellow]warning[/]: {escape(text)}", highlight=False)
    if note := noise_note(judged):
        console.print(f"[yellow]note[/]: {escape(note)}", highlight=False)
    raise typer.Exit(0 if all(c.passed for c in checks) else 1)


def _number(value: float) -> str:
    return "-" if value != value else f"{value:.4g}"  # NaN: not compared (see the note)


@app.command()
def report(
    folder: Annotated[str, typer.Argument(help="a run folder or a sweep folder")],
    cdn: Annotated[
        bool, Opt(help="load plotly.js from its CDN (small file, needs internet)")
    ] = False,
    pareto: Annotated[
        bool,
        Opt(help="a sweep: pareto.html, tok/s per user against tok/s, the frontier's points"),
    ] = False,
) -> None:
    """Rebuild report.html (plotly) from a run's or a sweep's files on disk."""
    from pathlib import Path

    from bench_cli.report.cli import build_report

    try:
        if pareto:
            from bench_cli.report.sweep import pareto_report

            if not (Path(folder) / "sweep.csv").is_file():
                raise ValueError(f"{folder}: --pareto takes a sweep folder (sweep.csv)")
            path = pareto_report(Path(folder), embed=not cdn)
        else:
            path = build_report(Path(folder), embed=not cdn)
    except (ValueError, OSError) as e:
        console.print(f"[bold red]error:[/] {escape(str(e))}", highlight=False)
        raise typer.Exit(2) from None
    console.print(f"wrote {escape(str(path))}", highlight=False)


@app.command("export-model")
def export_model(
    model: Annotated[str, typer.Argument(help="a model name, .gguf file or HF directory")],
    out: Annotated[str, typer.Argument(help="the directory to write")],
    dtype: Annotated[str, Opt(help="float32 | bfloat16")] = "float32",
) -> None:
    """Write a model as a Hugging Face directory (config, safetensors, tokenizer), so that vLLM
    or SGLang can serve the same weights as the bundled engine and both can be benched."""
    import torch

    from engine.model.export import export_hf_dir
    from engine.model.loader import ModelLoadError, load_model

    if dtype not in ("float32", "bfloat16"):
        console.print(f"[bold red]error:[/] dtype {dtype!r}: float32 or bfloat16", highlight=False)
        raise typer.Exit(2)
    try:
        loaded = load_model(model, getattr(torch, dtype), torch.device("cpu"))
    except ModelLoadError as e:
        console.print(f"[bold red]error:[/] {escape(str(e))}", highlight=False)
        raise typer.Exit(2) from None
    path = export_hf_dir(loaded, out)
    console.print(f"wrote {path} ({loaded.config.num_layers} layers, {dtype})", highlight=False)
