"""Write the generated reference pages: `python -m scripts.gen_docs [OUT_DIR]` (default
docs/reference). `make docs` runs it before `mkdocs build`; a test regenerates them into a
temporary folder and fails when the checked-in pages differ."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

from scripts.docgen.cli_ref import cli_page
from scripts.docgen.files_ref import files_page
from scripts.docgen.metrics_ref import exit_codes_page, metrics_page
from scripts.docgen.modules_ref import modules_page
from scripts.docgen.serving_ref import api_page, prometheus_page
from scripts.docgen.settings_ref import profiles_page, settings_page

PAGES: dict[str, Callable[[], str]] = {
    "cli.md": cli_page,
    "engine-settings.md": settings_page,
    "metrics.md": metrics_page,
    "result-files.md": files_page,
    "exit-codes.md": exit_codes_page,
    "openai-api.md": api_page,
    "prometheus.md": prometheus_page,
    "profiles.md": profiles_page,
    "modules.md": modules_page,
}


def write_pages(out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, make in PAGES.items():
        path = out / name
        path.write_text(make())
        written.append(path)
    return written


def main(argv: list[str]) -> int:
    out = Path(argv[0]) if argv else Path("docs/reference")
    for path in write_pages(out):
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
