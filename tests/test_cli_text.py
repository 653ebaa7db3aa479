"""What a person reads from the CLI: help and error texts keep every character (rich markup
once ate `[sweep]`), flags read as flags, and help fits a log file without a terminal."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from bench_cli.app import app

runner = CliRunner()


def help_text(*command: str) -> str:
    result = runner.invoke(app, [*command, "--help"], terminal_width=80)
    assert result.exit_code == 0, result.output
    return result.output


def test_help_keeps_square_brackets() -> None:
    assert "a run profile with a [sweep] table" in help_text("sweep")


@pytest.mark.parametrize("command", ["run", "sweep"])
def test_no_dashboard_is_one_flag(command: str) -> None:
    text = help_text(command)
    assert "--no-dashboard" in text and "--no-no-dashboard" not in text
    assert "no-no-dashboard" not in text


def test_help_without_a_terminal_keeps_the_whole_example() -> None:
    """At 80 columns the --base-url example was cut to `http://127.0.0.1:80…`."""
    text = help_text("run")
    assert "http://127.0.0.1:8000/v1" in text and "…" not in text


def test_a_sweep_profile_run_alone_says_why_it_lacks_a_rate(tmp_path) -> None:
    """`bench run --profile smoke` once got only "poisson arrivals need --rate"; the brackets
    of `[sweep]` in an error survive too."""
    result = runner.invoke(
        app, ["run", "--profile", "smoke", "--no-dashboard", "--out", str(tmp_path / "r")]
    )
    assert result.exit_code == 2
    flat = " ".join(result.output.split())
    assert "poisson arrivals need --rate" in flat
    assert "is a sweep profile: its [sweep] table sets --batching, --rate" in flat
    assert "bench sweep --profile smoke" in flat
