"""Every `bench` command and flag, read from the Typer app through its click commands: the
same help records `--help` prints, so this page and `--help` cannot disagree."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import typer.main
from typer._click.core import Context

from bench_cli.app import app
from scripts.docgen.markdown import code, page, table


def cli_page() -> str:
    group = typer.main.get_command(app)
    root = Context(group, info_name="bench")
    names = group.list_commands(root)
    body = ["## Commands\n", table(["command", "what it does"], _summaries(group, root, names))]
    for name in names:
        command = group.get_command(root, name)
        ctx = Context(command, info_name=name, parent=root)
        body.append(f"## bench {name}\n")
        body.append("```text\n" + command.get_usage(ctx) + "\n```\n")
        body.append(" ".join((command.help or "").split()) + "\n")
        for kind, header in (("argument", "argument"), ("option", "flag")):
            rows = []
            for p in command.params:
                if p.param_type_name != kind:
                    continue
                record = p.get_help_record(ctx) or (p.name.upper(), "")
                rows.append((code(record[0]), record[1]))
            if rows:
                body.append(table([header, "meaning [default]"], rows))
    intro = (
        "Every command of the `bench` CLI with every flag, as `bench COMMAND --help` prints "
        "them. Engine flags (`--max-num-seqs`, ...) are explained further in "
        "[engine settings](engine-settings.md); a profile's TOML keys are the flag names "
        "with underscores ([profiles](profiles.md))."
    )
    return page("CLI reference", "bench_cli/app.py", intro, "\n".join(body))


def _summaries(group: Any, root: Context, names: list[str]) -> Iterator[tuple[str, str]]:
    for name in names:
        command = group.get_command(root, name)
        first = " ".join((command.help or "").split()).split(". ")[0].rstrip(".")
        yield (f"[`bench {name}`](#bench-{name})", first)
