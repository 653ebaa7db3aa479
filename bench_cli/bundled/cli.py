"""`bench generate`, `bench serve` and `bench export-model`: the bundled engine itself, with
no load; the options of each command, and what it prints."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from bench_cli.console import console, print_error
from bench_cli.engine_options import engine_options
from engine.serving.access_log import QUIET_PATHS
from engine.serving.limits import API_KEY_ENV, ServerLimits

Opt = typer.Option


DEFAULT_PROMPTS = [
    "The capital of France is",
    "Write a Python function that checks whether a number is prime.",
    "Explain in two sentences why the sky is blue.",
    "List five fruits that are red:",
]


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
        print_error(console, str(e))
        raise typer.Exit(2) from None
    path = export_hf_dir(loaded, out)
    console.print(
        f"wrote {path} ({loaded.config.num_layers} layers, {dtype})",
        highlight=False,
        soft_wrap=True,
    )
