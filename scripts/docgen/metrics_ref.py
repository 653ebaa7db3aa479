"""Metrics with definitions and units (loadgen/metrics.py's DEFINITIONS and DISTRIBUTIONS,
the summary's scalar keys, the gate's directions) and the exit codes, computed by calling
the code that decides them."""

from __future__ import annotations

import signal
from typing import Any

from bench_cli.gate import HIGHER_IS_BETTER, LOWER_IS_BETTER
from bench_cli.run_command import INVALID_EXIT, exit_code
from loadgen.metrics import DEFINITIONS, DISTRIBUTIONS, SLO, STATS, summarize
from loadgen.records import RequestRecord
from scripts.docgen.markdown import code, page, table

# Units by what a key counts; a summary key that none of these covers stops the generator,
# so a new metric cannot reach the reference without one.
RATE_UNITS = {
    "request_throughput": "requests/s",
    "goodput": "requests/s",
    "output_throughput": "output tokens/s",
    "total_token_throughput": "(prompt + output) tokens/s",
    "peak_output_throughput": "output tokens/s",
}
COUNT_UNITS = {
    "completed": "requests",
    "failed": "requests",
    "cancelled": "requests",
    "peak_concurrent_requests": "requests",
    "total_input_tokens": "tokens",
    "total_cached_tokens": "tokens",
    "total_output_tokens": "tokens",
    "valid": "true/false",
}
NOT_METRICS = {"slo", "definitions", "tokens_counted_by", "failure_reasons", "warnings"}


def unit(key: str) -> str:
    if key in RATE_UNITS:
        return RATE_UNITS[key]
    if key in COUNT_UNITS:
        return COUNT_UNITS[key]
    if key.endswith("_s"):
        return "s"
    raise KeyError(f"no unit for summary key {key!r}: add it to scripts/docgen/metrics_ref.py")


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


def direction(key: str) -> str:
    if key in HIGHER_IS_BETTER:
        return "higher"
    if key in LOWER_IS_BETTER or key in DISTRIBUTIONS:
        return "lower"
    return "-"


def _definition(key: str) -> str:
    return DEFINITIONS.get(key.removesuffix("_s"), DEFINITIONS.get(key, ""))


def metrics_page() -> str:
    summary = sample_summary()
    stats = ", ".join(STATS)
    rows = [
        (code(key), label, "s", direction(key), _definition(key))
        for key, label in DISTRIBUTIONS.items()
    ]
    dists = table(["key", "label in tables", "unit", "better", "definition"], rows)
    rows = [
        (code(key), unit(key), direction(key), _definition(key))
        for key, value in summary.items()
        if key not in DISTRIBUTIONS and key not in NOT_METRICS and not isinstance(value, dict)
    ]
    scalars = table(["key", "unit", "better", "definition"], rows)
    body = (
        "## Latency distributions\n\n"
        f"Each is an object in summary.json with `{stats}` (and `count`), in seconds; tables "
        "and reports print milliseconds. `bench gate` takes them as `KEY.STAT` "
        "(`ttft_s.p99`).\n\n"
        f"{dists}\n## Scalars\n\n"
        "Throughputs divide by `duration_s` (the first scheduled send to the end of the last "
        'request). "better" is the direction `bench gate` judges a change by (only the '
        "metrics with a direction can be gated).\n\n"
        f"{scalars}"
    )
    intro = (
        "What a run measures, from loadgen/metrics.py (`DEFINITIONS`, `DISTRIBUTIONS`) and "
        "the keys `summarize()` writes. Peers name these differently (vLLM's TPOT excludes "
        "the first token, guidellm's includes it, AIPerf calls it ITL): every summary.json "
        "stores the definitions it used under `definitions`. An SLO (`--slo "
        "ttft=0.5,tpot=0.05,e2e=10`, seconds) is what goodput is judged by."
    )
    return page("Metrics", "loadgen/metrics.py", intro, body)


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
        "bench_cli/run_command.py; 0, 1, 3 and the signals' codes above come from its "
        "`exit_code()`, called on summaries of each kind (2 is the commands' `typer.Exit(2)` on "
        "bad input). A signal gives 128 + its number, the shell's convention.\n\n"
        f"## bench gate\n\n{gate}"
    )
    intro = "What each exit status of `bench` means, and what to change."
    return page("Exit codes", "bench_cli/run_command.py", intro, body)
