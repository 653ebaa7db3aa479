"""`bench run` against servers that are not ours (issue 47): the mock server speaking vLLM's,
SGLang's and llama.cpp's dialects."""

from __future__ import annotations

import io

from rich.console import Console

from bench_cli.tables import print_result


def _printed(summary: dict) -> str:
    out = io.StringIO()
    print_result(Console(file=out, width=200), summary, "title")
    return out.getvalue()


def test_the_table_shows_the_scheduled_rate_beside_the_achieved_one() -> None:
    from loadgen.metrics import summarize

    summary = summarize([], 1.0, None)
    summary["arrival_check"] = {"achieved_rate": 1.49, "scheduled_rate": 1.486}
    text = _printed(summary)
    assert "1.49 (scheduled 1.49)" in text
