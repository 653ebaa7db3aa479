"""The `bench` command line."""

from __future__ import annotations

import typer

from bench_cli.bundled.cli import export_model, generate, serve
from bench_cli.calibrate.cli import calibrate
from bench_cli.claims.cli import claims
from bench_cli.gate.cli import gate
from bench_cli.profile.cli import profile
from bench_cli.report.cli import report
from bench_cli.run.cli import run
from bench_cli.sweep.cli import sweep

app = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__, rich_markup_mode=None)


@app.callback()
def main() -> None:
    """servebench: benchmark and profile LLM serving."""


# In the order `bench --help` lists them. Each command parses its options and calls its
# package; the option declarations shared by several are bench_cli/*_options.py.
app.command()(generate)
app.command()(serve)
app.command()(run)
app.command()(sweep)
app.command()(calibrate)
app.command()(claims)
app.command()(profile)
app.command()(gate)
app.command()(report)
app.command("export-model")(export_model)
