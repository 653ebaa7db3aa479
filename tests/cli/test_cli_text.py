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


def test_every_flag_the_readme_and_guides_name_exists() -> None:
    """README, guides and code must not drift: each `--flag` README or a hand-written docs page
    gives for a `bench` command is in some command's help (flags of benchmarks/ scripts, pip
    and vLLM's bench are not ours; docs/reference is generated from the help itself)."""
    import re
    from pathlib import Path

    ours: set[str] = set()
    for command in (
        "run",
        "sweep",
        "claims",
        "gate",
        "report",
        "serve",
        "generate",
        "export-model",
        "profile",
        "calibrate",
    ):
        ours |= set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", help_text(command)))
    root = Path(__file__).parents[2]
    # docs/benchmarking-other-servers.md gives other servers' flags (as do paragraphs naming
    # them, below); reference/ is generated.
    pages = [root / "README.md", root / "docs" / "index.md"]
    pages += [*(root / "docs" / "guides").glob("*.md"), *(root / "docs" / "design").glob("*.md")]
    missing = set()
    for page in pages:
        for paragraph in page.read_text().split("\n\n"):
            if re.search(
                r"benchmarks/|pip install|vllm bench|vllm serve|sglang|llama-server", paragraph
            ):
                continue
            found = set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", paragraph)) - ours
            missing |= {f"{page.relative_to(root)}: {flag}" for flag in found}
    assert not missing, f"docs name flags no command has: {sorted(missing)}"


@pytest.mark.parametrize("command", ["serve", "generate", "run"])
def test_every_engine_argument_is_a_flag(command: str) -> None:
    """`bench serve --scheduling-policy` was missing while LLM(scheduling_policy=) worked."""
    from engine.config import engine_arg_names

    text = help_text(command)
    missing = [a for a in engine_arg_names() if f"--{a.replace('_', '-')}" not in text]
    assert not missing, f"bench {command} lacks {missing}"


def test_latency_cells_show_no_negative_zero() -> None:
    """A virtual clock's schedule lag is ~1e-13 s below zero: 0.00, not -0.00; a real
    negative lag still shows its sign."""
    from bench_cli.tables import _ms

    assert _ms(-1e-16) == "0.00" and _ms(-0.0005) == "-0.50" and _ms(0.0123) == "12.3"
