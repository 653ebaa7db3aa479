"""The console every command prints to."""

from __future__ import annotations

import sys

from rich.console import Console
from rich.markup import escape

# Without a terminal (CI logs, a server's log file) rich would wrap at 80 columns, folding
# tables into unreadable cells; logs can be wide.
console = Console(width=None if sys.stdout.isatty() else 200)


def print_error(out: Console, message: str) -> None:
    """An error exactly as written: no markup read into it, no line folded through a path."""
    out.print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
