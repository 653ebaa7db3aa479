"""The console every command prints to."""

from __future__ import annotations

import sys

from rich.console import Console

# Without a terminal (CI logs, a server's log file) rich would wrap at 80 columns, folding
# tables into unreadable cells; logs can be wide.
console = Console(width=None if sys.stdout.isatty() else 200)
