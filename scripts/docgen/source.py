"""Reading the comments that stand beside a field or a key in the source: the code's own
words are what the reference pages print."""

from __future__ import annotations

import ast
import inspect
import textwrap


def comment_at(lines: list[str], first: int, last: int) -> str:
    """The comment lines right above line `first` and any `  # ...` ending lines first..last
    (1-based, inclusive)."""
    above = []
    i = first - 2
    while i >= 0 and lines[i].strip().startswith("#"):
        above.insert(0, lines[i].strip().lstrip("#").strip())
        i -= 1
    trailing = [
        line.split("  # ", 1)[1].strip() for line in lines[first - 1 : last] if "  # " in line
    ]
    return " ".join(above + trailing)


def field_comments(cls: type) -> dict[str, str]:
    """Each dataclass field's comment (above it, or at the end of its line)."""
    source = inspect.getsource(cls)
    lines = source.splitlines()
    out = {}
    for node in ast.parse(source).body[0].body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            out[node.target.id] = comment_at(lines, node.lineno, node.end_lineno or node.lineno)
    return out


def dict_key_comments(func: object) -> dict[str, str]:
    """The string keys of the dict literals in a function, with their comments."""
    source = inspect.getsource(func)  # type: ignore[arg-type]
    lines = source.splitlines()
    out = {}
    for node in ast.walk(ast.parse(textwrap.dedent(source))):
        if isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values, strict=True):
                if isinstance(key, ast.Constant) and isinstance(key.value, str):
                    out[key.value] = comment_at(lines, key.lineno, value.end_lineno or key.lineno)
    return out
