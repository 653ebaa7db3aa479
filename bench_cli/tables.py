"""The printed result, in the shape users know from `vllm bench serve`."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from bench_cli.outcome import notices
from bench_cli.worker_view import worker_table
from loadgen.metric_registry import distributions
from loadgen.metrics import STATS
from loadgen.redact import printable


def result_tables(summary: dict[str, Any], title: str) -> list[Table]:
    head = Table(title=title, show_header=False, title_justify="left")
    head.add_column("metric")
    head.add_column("value", justify="right")
    rows = [
        ("Successful requests", f"{summary['completed']}"),
        ("Failed requests", f"{summary['failed']}"),
        ("Benchmark duration (s)", f"{summary['duration_s']:.2f}"),
        ("Total input tokens", f"{summary['total_input_tokens']}"),
        *_cached_row(summary),
        ("Total generated tokens", f"{summary['total_output_tokens']}"),
        ("Request throughput (req/s)", f"{summary['request_throughput']:.2f}"),
        ("Output token throughput (tok/s)", f"{summary['output_throughput']:.2f}"),
        ("Total token throughput (tok/s)", f"{summary['total_token_throughput']:.2f}"),
    ]
    if "peak_output_throughput" in summary:  # summaries written before it have none
        rows[-1:-1] = [
            ("Peak output token throughput (tok/s)", f"{summary['peak_output_throughput']:.2f}"),
            ("Peak concurrent requests", f"{summary['peak_concurrent_requests']}"),
        ]
    if summary.get("goodput") is not None:
        slo = ", ".join(f"{k} <= {v:g} s" for k, v in summary["slo"].items())
        slo = "each class's SLO" if summary.get("classes") else slo
        rows.append((f"Goodput (req/s; {slo})", f"{summary['goodput']:.2f}"))
    check = summary.get("arrival_check") or {}
    if check.get("achieved_rate"):
        # Beside what the seeded schedule held: a short run's draws differ from the asked rate
        # (20 Poisson arrivals at 2 req/s may span 1.49 req/s) without the client lagging.
        sched = check.get("scheduled_rate")
        value = f"{check['achieved_rate']:.2f}" + (f" (scheduled {sched:.2f})" if sched else "")
        rows.append(("Achieved arrival rate (req/s)", value))
    if "ks_vs_target" in check:
        ks = check["ks_vs_target"]
        rows.append(
            (
                f"Arrivals vs {check['process']} (KS D, p)",
                f"{ks['statistic']:.3f}, {ks['p_value']:.2f}",
            )
        )
    rows += _spec_rows(summary.get("telemetry") or {})
    for name, value in rows:
        head.add_row(name, value)

    lat = Table(title="Latency (ms)", title_justify="left")
    lat.add_column("metric", no_wrap=True)
    for col in STATS:
        lat.add_column(col, justify="right", no_wrap=True)
    queued = bool((summary.get("queue_s") or {}).get("max"))
    for key, label in distributions().items():
        d = summary.get(key)
        if not d or not d.get("count") or ("queue" in key and not queued):
            continue
        lat.add_row(label, *(_ms(d[s]) for s in STATS))
    tables = [head, lat]
    if summary.get("multi_turn"):
        tables.append(turn_table(summary["multi_turn"]))
    if summary.get("classes"):
        tables.append(class_table(summary["classes"]))
    if (workers := worker_table(summary)) is not None:
        tables.append(workers)
    return tables


CLASS_LATENCIES = (("TTFT", "ttft_s"), ("TPOT", "tpot_s"), ("E2E", "e2e_s"))


def class_table(classes: dict[str, Any]) -> Table:
    """Each traffic class on its own: a mix is judged class by class (the batch class's
    long prompts can hide behind the interactive class's quick ones in the pooled figures)."""
    table = Table(title="Per class (latency in ms)", title_justify="left")
    columns = ["class", "ok", "failed", "req/s", "out tok/s"]
    columns += [f"{label} {s}" for label, _ in CLASS_LATENCIES for s in ("p50", "p99")]
    for col in [*columns, "goodput (req/s; SLO)"]:
        table.add_column(col, justify="left" if col == "class" else "right", no_wrap=True)
    for name, c in classes.items():
        cells = [escape(name), str(c["completed"]), str(c["failed"])]
        cells += [f"{c['request_throughput']:.2f}", f"{c['output_throughput']:.1f}"]
        for _, key in CLASS_LATENCIES:
            d = c[key]
            cells += [_ms(d[s]) if d.get("count") else "-" for s in ("p50", "p99")]
        slo = ", ".join(f"{k} <= {v:g} s" for k, v in c["slo"].items())
        cells.append(f"{c['goodput']:.2f} ({slo})" if c.get("goodput") is not None else "-")
        table.add_row(*cells)
    return table


def turn_table(multi: dict[str, Any]) -> Table:
    """TTFT turn by turn: a later turn carries the whole conversation, so its TTFT shows
    what prefix caching saves (or what recomputing the context costs)."""
    title = (
        f"Multi-turn: {multi['conversations']} conversations, {multi['cut_short']} cut short "
        "by a failed turn"
    )
    table = Table(title=title, title_justify="left")
    for col in ("turn", "requests", "ok", "prompt tokens (mean)", "TTFT mean", "p50", "p99"):
        table.add_column(col, justify="right", no_wrap=True)
    for turn, row in multi["per_turn"].items():
        d, tokens = row["ttft_s"], row["mean_prompt_tokens"]
        stats = [_ms(d[s]) if d["count"] else "-" for s in ("mean", "p50", "p99")]
        prompt = f"{tokens:.0f}" if tokens is not None else "-"
        table.add_row(turn, str(row["requests"]), str(row["completed"]), prompt, *stats)
    return table


def _ms(seconds: float) -> str:
    """z: a float's dust below zero (a virtual clock's schedule lag) shows as 0.00, not -0.00."""
    ms = seconds * 1e3
    return f"{ms:z.2f}" if ms < 10 else f"{ms:.1f}" if ms < 1000 else f"{ms:.0f}"


def _print_engine_gauges(console: Console, telemetry: dict[str, Any]) -> None:
    """Whose /metrics names the timeline's engine columns came from, or why it has none."""
    if "metrics_dialect" not in telemetry:  # no /metrics to read (in process, simulated)
        return
    if dialect := telemetry["metrics_dialect"]:
        cols = [c.removeprefix("engine_") for c in telemetry["columns"] if c.startswith("engine_")]
        console.print(f"engine gauges: {dialect}'s /metrics names -> {', '.join(cols)}")
    for note in telemetry.get("notes", []):
        if note.startswith("no engine gauges"):
            console.print(f"[yellow]note:[/] {escape(printable(note))}", highlight=False)


def print_result(console: Console, summary: dict[str, Any], title: str) -> None:
    for table in result_tables(summary, title):
        console.print(table)
    for warning in summary.get("warnings", []):
        style = "bold red" if "fell behind" in warning else "yellow"
        console.print(f"[{style}]warning:[/] {escape(printable(warning))}", highlight=False)
    _print_engine_gauges(console, summary.get("telemetry") or {})
    for notice in notices(summary):
        style = "bold red" if notice.severity == "error" else "yellow"
        console.print(
            f"[{style}]{notice.label}[/]: {escape(printable(notice.text))}", highlight=False
        )
    if summary.get("cold_start"):
        console.print(
            "[yellow]cold start[/]: the bundled engine was started for this run and got no "
            "warm-up requests (--warmup 0); its first requests include one-off first-use costs"
        )


def _cached_row(summary: dict[str, Any]) -> list[tuple[str, str]]:
    """Prompt tokens served by the server's prefix cache, where its usage reports them."""
    cached, total = summary.get("total_cached_tokens"), summary["total_input_tokens"]
    rows = []
    added = summary.get("prompt_tokens_added") or {}
    if added.get("mean", 0) >= 1:  # the server's chat template (or BOS): see the warning
        each = (
            f"{added['min']}" if added["min"] == added["max"] else f"{added['min']}-{added['max']}"
        )
        rows.append(("  of which added by the server", f"{added['total']} ({each} a request)"))
    if cached is None:
        return rows
    share = f" ({cached / total:.0%})" if total else ""
    return [*rows, ("  of which from the prefix cache", f"{cached}{share}")]


def _spec_rows(telemetry: dict[str, Any]) -> list[tuple[str, str]]:
    """Speculative decoding over the run, from the server's counters (ours or vLLM's)."""
    if not telemetry.get("spec_drafts"):
        return []
    rate = telemetry.get("spec_acceptance_rate")
    rows = [
        ("Spec decode acceptance rate (%)", "-" if rate is None else f"{rate * 100:.1f}"),
        ("Spec decode acceptance length", f"{telemetry['spec_mean_acceptance_length']:.2f}"),
        (
            "  drafts / draft tokens / accepted",
            "{:.0f} / {:.0f} / {:.0f}".format(
                telemetry["spec_drafts"],
                telemetry["spec_draft_tokens"],
                telemetry["spec_accepted_tokens"],
            ),
        ),
    ]
    if per_pos := telemetry.get("spec_acceptance_per_pos"):
        rows.append(("  accepted by draft position", ",".join(f"{r:.3f}" for r in per_pos)))
    if (share := telemetry.get("spec_draft_share")) is not None:
        rows.append(("  decodes given a draft", f"{share:.3f}"))
    return rows


def sim_title(engine: dict[str, Any], model: str | None) -> str:
    """What a simulated run ran on, in words: shown wherever its result is."""
    sim = engine.get("sim") or {}
    device = sim.get("device")
    device_name = device.get("name") if isinstance(device, dict) else device or "local"
    tp = engine.get("tensor_parallel_size", 1)
    gpus = f"{tp} x {device_name}" if tp > 1 else device_name
    return f"SIMULATED {model} on {gpus} ({sim.get('cost_model', '?')} step times)"
