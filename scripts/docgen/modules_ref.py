"""A map of every module of the three packages, from each file's own docstring (read with
ast, nothing imported), so a new module shows up here with its own words."""

from __future__ import annotations

import ast
from pathlib import Path

from scripts.docgen.markdown import code, page, table

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = {
    "engine": "the measured side: the bundled inference engine and its OpenAI-compatible server",
    "loadgen": "the measuring side: arrivals, workloads, backends, records, metrics, telemetry",
    "bench_cli": "the user's side: Typer commands, tables, dashboard, reports, gates",
}


def first_sentence(path: Path) -> str:
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    text = " ".join(doc.split())
    end = text.find(". ")
    return text if end < 0 else text[: end + 1]


def modules_page() -> str:
    parts = []
    for package, role in PACKAGES.items():
        rows = []
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if "__pycache__" in rel:
                continue
            rows.append((code(rel), first_sentence(path)))
        parts.append(f"## {package}/\n\n{role}.\n\n" + table(["module", "what it is"], rows))
    intro = (
        "Every module of the three packages with the first sentence of its docstring. "
        "Imports flow one way, `bench_cli -> loadgen -> engine`; how the parts fit: "
        "[architecture](../design/architecture.md)."
    )
    return page("Module map", "each module's docstring", intro, "\n".join(parts))
