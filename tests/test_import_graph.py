"""The import graph of bench_cli, loadgen and engine, read from the source with `ast`: no
module imports itself through others (an import circle: two modules that can only be loaded
and understood together), and imports flow one way, bench_cli -> loadgen -> engine.

Three kinds of import are told apart: at module level (run when the module loads), inside a
function (run when it is called: lazy, to keep start-up light) and under `if TYPE_CHECKING:`
(never run). Circles are checked among module-level imports, then with the lazy ones added;
the direction is checked for every import, type-only ones included."""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("bench_cli", "loadgen", "engine")
# Who may import whom: an import from a package to one not listed beside it flows the
# wrong way (the engine knows nothing of its load generator; the load generator nothing of
# the CLI).
ALLOWED = {
    "bench_cli": {"bench_cli", "loadgen", "engine"},
    "loadgen": {"loadgen", "engine"},
    "engine": {"engine"},
}
Edges = dict[str, dict[str, set[str]]]  # module -> kind ("top", "lazy", "typing") -> targets


def modules(root: Path, packages: Iterable[str]) -> dict[str, Path]:
    """Dotted name -> file of every module of the packages (a package by its __init__)."""
    found = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            found[name] = path
    return found


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.Module) -> Iterable[tuple[ast.Import | ast.ImportFrom, str]]:
    """Every import statement with its kind: module level (inside if/try/with blocks too),
    lazy (inside a function) or typing (under `if TYPE_CHECKING:`)."""

    def walk(nodes: list[ast.stmt], kind: str) -> Iterable[tuple[ast.Import | ast.ImportFrom, str]]:
        for node in nodes:
            if isinstance(node, ast.Import | ast.ImportFrom):
                yield node, kind
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                yield from walk(node.body, "lazy" if kind == "top" else kind)
            elif isinstance(node, ast.If) and _is_type_checking(node.test):
                yield from walk(node.body, "typing")
                yield from walk(node.orelse, kind)
            else:  # class bodies, if/else, try/except, with, loops: as their block runs
                for field in ("body", "orelse", "finalbody"):
                    yield from walk(getattr(node, field, []) or [], kind)
                for handler in getattr(node, "handlers", []) or []:
                    yield from walk(handler.body, kind)
                for case in getattr(node, "cases", []) or []:
                    yield from walk(case.body, kind)

    yield from walk(tree.body, "top")


def _targets(node: ast.Import | ast.ImportFrom, name: str, path: Path, known: set[str]) -> set[str]:
    """The modules of ours an import statement loads: `from a.b import c` is a.b.c where c
    is a module, else a.b; a relative import is resolved against the importing module."""
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    else:
        base = node.module or ""
        if node.level:
            package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
            package = package[: len(package) - (node.level - 1)]
            base = ".".join(package + ([base] if base else []))
        names = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
    out = set()
    for target in names:
        while target and target not in known:  # `import a.b.c` of a non-module: its package
            target = target.rpartition(".")[0]
        if target:
            out.add(target)
    return out


def import_graph(root: Path, packages: Iterable[str] = PACKAGES) -> Edges:
    found = modules(root, packages)
    known = set(found)
    graph: Edges = {}
    for name, path in found.items():
        kinds: dict[str, set[str]] = {"top": set(), "lazy": set(), "typing": set()}
        for node, kind in _imports(ast.parse(path.read_text(), str(path))):
            kinds[kind] |= _targets(node, name, path, known) - {name}
        graph[name] = kinds
    return graph


def circles(graph: Edges, kinds: tuple[str, ...]) -> list[list[str]]:
    """The import circles (strongly connected components of more than one module) among the
    edges of the given kinds (Tarjan's algorithm, iteratively), each sorted, largest first."""
    edges = {m: sorted(set().union(*(k[kind] for kind in kinds))) for m, k in graph.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(edges):
        if start in index:
            continue
        work = [(start, iter(edges[start]))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(edges.get(child, []))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    m = stack.pop()
                    on_stack.discard(m)
                    component.append(m)
                    if m == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return sorted(found, key=len, reverse=True)


def wrong_way(graph: Edges) -> list[str]:
    """Every import, of any kind, from a package to one it may not import."""
    out = []
    for module, kinds in sorted(graph.items()):
        own = module.partition(".")[0]
        for kind, targets in kinds.items():
            for target in sorted(targets):
                if target.partition(".")[0] not in ALLOWED.get(own, {own}):
                    out.append(f"{module} imports {target} ({kind})")
    return out


@pytest.fixture(scope="module")
def graph() -> Edges:
    return import_graph(ROOT)


def test_the_graph_sees_every_module_and_import_kind(graph: Edges) -> None:
    """The parse itself: modules known to exist are found with imports known to be there
    (a graph of nothing would pass every check below)."""
    assert {"bench_cli.app", "loadgen.runner", "engine.engine", "engine.step_log"} <= set(graph)
    assert "engine.step_log" in graph["engine.engine"]["top"]
    assert "bench_cli.run.execute" in graph["bench_cli.run.cli"]["lazy"]
    assert "engine.sim.sim_engine" in graph["engine.sim.lazy_decodes"]["typing"]


def test_no_import_circle_among_module_level_imports(graph: Edges) -> None:
    assert circles(graph, ("top",)) == []


def test_no_import_circle_with_the_lazy_imports_too(graph: Edges) -> None:
    """An import inside a function only postpones a circle: the two modules still need each
    other."""
    assert circles(graph, ("top", "lazy")) == []


def test_imports_flow_from_cli_to_load_generator_to_engine(graph: Edges) -> None:
    assert wrong_way(graph) == []


def test_the_command_line_starts_without_its_commands_heavy_imports() -> None:
    """`bench_cli.app` lists every command, so each package's cli.py imports its work inside
    the command: loading the app (every `bench` start) pulls in no torch, plotly or pandas."""
    code = (
        "import sys, bench_cli.app\n"
        "heavy = ('torch', 'plotly', 'pandas', 'engine.engine')\n"
        "print(sorted(m for m in heavy if m in sys.modules))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]", done.stdout


def test_the_checks_catch_a_circle_and_a_wrong_way_import(tmp_path: Path) -> None:
    """On a made-up tree: a circle of module-level imports, one closed only by a lazy import,
    a type-only import back (not a circle), and the engine importing the CLI."""
    files = {
        "engine/__init__.py": "",
        "engine/a.py": "from engine import b, e\n",
        "engine/b.py": "import engine.a\nfrom bench_cli.x import y\n",
        "engine/c.py": "from . import d\n",
        "engine/d.py": "def f():\n    from engine.c import g\n",
        "engine/e.py": "import typing\nif typing.TYPE_CHECKING:\n    from engine import a\n",
        "bench_cli/__init__.py": "",
        "bench_cli/x.py": "from engine.e import z\ny = 1\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    made_up = import_graph(tmp_path, ("engine", "bench_cli"))
    assert circles(made_up, ("top",)) == [["engine.a", "engine.b"]]
    assert sorted(circles(made_up, ("top", "lazy"))) == [
        ["engine.a", "engine.b"],
        ["engine.c", "engine.d"],
    ]
    assert wrong_way(made_up) == ["engine.b imports bench_cli.x (top)"]
