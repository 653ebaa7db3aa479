"""The `bench` command line."""

from __future__ import annotations

import time
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

app = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__)
console = Console()

DEFAULT_PROMPTS = [
    "The capital of France is",
    "Write a Python function that checks whether a number is prime.",
    "Explain in two sentences why the sky is blue.",
    "List five fruits that are red:",
]


@app.callback()
def main() -> None:
    """servebench: benchmark and profile LLM serving."""


@app.command()
def generate(
    prompts: Annotated[
        list[str] | None, typer.Argument(help="prompts (default: a few demos)")
    ] = None,
    model: str = "smollm2-135m",
    max_tokens: int = 48,
    temperature: float = 0.0,
    seed: int = 0,
    chat: Annotated[bool, typer.Option(help="wrap each prompt in the chat template")] = True,
    dtype: str = "bfloat16",
    device: str = "auto",
    batching: str = "continuous",
    max_num_seqs: int = 64,
    max_num_batched_tokens: int | None = None,
    enable_chunked_prefill: bool = True,
    long_prefill_token_threshold: int = 0,
    block_size: int = 16,
    num_kv_blocks: int | None = None,
    kv_cache_memory_gb: float | None = None,
) -> None:
    """Generate offline with the bundled engine and show its KV-cache and batching stats."""
    from engine import LLM, SamplingParams

    t0 = time.perf_counter()
    llm = LLM(
        model,
        dtype=dtype,
        device=device,
        seed=seed,
        batching=batching,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        enable_chunked_prefill=enable_chunked_prefill,
        long_prefill_token_threshold=long_prefill_token_threshold,
        block_size=block_size,
        num_kv_blocks=num_kv_blocks,
        kv_cache_memory_gb=kv_cache_memory_gb,
    )
    load_s = time.perf_counter() - t0
    texts = prompts or DEFAULT_PROMPTS
    tokenizer = llm.get_tokenizer()
    if chat and tokenizer is not None and tokenizer.chat_template:
        texts = [tokenizer.apply_chat_template([{"role": "user", "content": p}]) for p in texts]
    params = SamplingParams(max_tokens=max_tokens, temperature=temperature, seed=seed)
    t0 = time.perf_counter()
    outputs = llm.generate(texts, params)
    gen_s = time.perf_counter() - t0

    table = Table(title=f"{model} ({dtype}, {batching} batching)", show_lines=True)
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
    console.print(
        f"load {load_s:.1f} s · generate {gen_s:.2f} s · {n_out / gen_s:.1f} output tok/s · "
        f"{stats['num_steps']} steps · {stats['num_preemptions']} preemptions"
    )
    console.print(
        f"KV cache: peak {stats['kv_peak_blocks_used']}/{stats['kv_blocks_total']} blocks of "
        f"{stats['kv_block_size']} tokens = {paged:.1f} MiB paged, vs {contiguous:.1f} MiB if each "
        f"request had reserved the full context ({llm.llm_engine.max_model_len} tokens) "
        f"contiguously"
    )
