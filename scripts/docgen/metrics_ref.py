"""Metrics with definitions, units and directions (loadgen/metric_registry.py), checked
against the keys `summarize()` writes, and the exit codes, computed by calling the code that
decides them."""

from __future__ import annotations

import signal
from typing import Any

from bench_cli.run.execute import INVALID_EXIT, exit_code
from loadgen import metric_registry
from loadgen.metric_registry import NOT_METRICS, Metric
from loadgen.metrics import SLO, STATS, summarize
from loadgen.records import RequestRecord
from scripts.docgen.markdown import code, page, table


def unit(key: str) -> str:
    """A summary key's unit, from the registry; a key it lacks stops the generator, so a
    metric cannot reach the reference (or the summary) undeclared."""
    m = metric_registry.metric(key)
    if m is None:
        raise KeyError(f"summary key {key!r} is not in loadgen/metric_registry.py: declare it")
    return m.unit


def sample_summary() -> dict[str, Any]:
    """A summary of four made-up requests: its keys are every summary's metric keys."""
    records = [
        RequestRecord(
            i,
            str(i),
            8,
            3,
            scheduled_s=i / 10,
            send_s=i / 10,
            first_chunk_s=i / 10 + 0.05,
            end_s=i / 10 + 0.15,
            chunk_s=[i / 10 + 0.05 * k for k in (1, 2, 3)],
            chunk_tokens=[1, 1, 1],
            prompt_tokens=8,
            output_tokens=3,
            status="ok",
        )
        for i in range(4)
    ]
    return summarize(records, 1.0, slo=SLO(ttft=1.0))


def _better(m: Metric) -> str:
    return m.better or "-"


def _rows(kind: str) -> list[tuple[str, ...]]:
    return [
        (code(m.name), m.unit, _better(m), m.definition)
        for m in metric_registry.of_kind(kind)  # type: ignore[arg-type]
    ]


def metrics_page() -> str:
    summary = sample_summary()
    for key, value in summary.items():  # every scalar summarize() writes is declared
        if key not in NOT_METRICS and not isinstance(value, dict):
            unit(key)
    stats = ", ".join(STATS)
    rows = [
        (code(m.name), m.label, m.unit, _better(m), m.definition)
        for m in metric_registry.of_kind("distribution")
    ]
    dists = table(["key", "label in tables", "unit", "better", "definition"], rows)
    header = ["key", "unit", "better", "definition"]
    body = (
        "## Latency distributions\n\n"
        f"Each is an object in summary.json with `{stats}` (and `count`), in seconds; tables "
        "and reports print milliseconds. `bench gate` takes them as `KEY.STAT` "
        "(`ttft_s.p99`).\n\n"
        f"{dists}\n## Scalars\n\n"
        "Throughputs divide by `duration_s` (the first scheduled send to the end of the last "
        'request). "better" is the direction `bench gate` judges a change by (every metric '
        "with a direction can be gated). summary.csv names a rate's column with its unit "
        "(`output_throughput_tok_per_s`).\n\n"
        f"{table(header, _rows('scalar'))}\n"
        "## Objects\n\nIn summary.json, described but not gated.\n\n"
        f"{table(header, _rows('detail'))}\n"
        "## Derived by sweeps\n\nsweep.csv computes these from each run's summary.\n\n"
        f"{table(header, _rows('derived'))}\n"
        "## Engine telemetry\n\nFrom the server's /metrics over the run, where it exports "
        "them: summary.json's `telemetry` object, sweep.csv's `telemetry.*` columns; gated "
        "by their dotted name.\n\n"
        f"{table(header, _rows('telemetry'))}"
    )
    intro = (
        "What a run measures, from loadgen/metric_registry.py (one entry a metric: its key, "
        "unit, direction and definition). Peers name these differently (vLLM's TPOT excludes "
        "the first token, guidellm's includes it, AIPerf calls it ITL): every summary.json "
        "stores the definitions it used under `definitions`. An SLO (`--slo "
        "ttft=0.5,tpot=0.05,e2e=10`, seconds) is what goodput is judged by."
    )
    return page("Metrics", "loadgen/metric_registry.py", intro, body)


EXIT_CASES = (
    (
        "the run finished (some requests may have failed: the summary counts them)",
        {"interrupted": False, "completed": 5, "valid": True},
    ),
    (
        "nothing was measured: the test request failed, no request succeeded, or the first "
        "10 failed alike and the run stopped early",
        {"interrupted": False, "completed": 0},
    ),
    (
        "INVALID: the run finished, but its p99 schedule lag exceeded `--max-p99-lag-ms`: the "
        "results describe another load than the one asked for (a sweep: some point was). Lower "
        "the rate, give the load generator a core of its own, or run the server elsewhere",
        {"interrupted": False, "completed": 5, "valid": False},
    ),
    (
        "interrupted by Ctrl-C (SIGINT), in any phase; what finished is written",
        {"interrupted": True, "stop_signal": signal.SIGINT, "completed": 5},
    ),
    (
        "stopped by SIGTERM, in any phase; what finished is written",
        {"interrupted": True, "stop_signal": signal.SIGTERM, "completed": 5},
    ),
)


def exit_codes_page() -> str:
    rows = [(exit_code(summary), meaning) for meaning, summary in EXIT_CASES]
    rows.insert(
        2,
        (
            2,
            "bad input: a flag, profile, trace or dataset, or the bundled engine "
            "did not start (nothing is run)",
        ),
    )
    runs = table(["exit", "meaning"], sorted(rows, key=lambda r: r[0]))
    gate = table(
        ["exit", "meaning"],
        [
            (0, "every check passed"),
            (
                1,
                "a regression beyond its limit, a failed ratio, or a run that measured nothing "
                "or was INVALID (unless `--allow-invalid`)",
            ),
            (
                2,
                "unusable input: a missing folder, an unknown metric, a selector matching no "
                "row or several",
            ),
        ],
    )
    body = (
        "## bench run, bench sweep, bench claims\n\n"
        f"{runs}\nThe INVALID code is `INVALID_EXIT = {INVALID_EXIT}` in "
        "bench_cli/run/execute.py; 0, 1, 3 and the signals' codes above come from its "
        "`exit_code()`, called on summaries of each kind (2 is the commands' `typer.Exit(2)` on "
        "bad input). A signal gives 128 + its number, the shell's convention.\n\n"
        f"## bench gate\n\n{gate}"
    )
    intro = "What each exit status of `bench` means, and what to change."
    return page("Exit codes", "bench_cli/run/execute.py", intro, body)
