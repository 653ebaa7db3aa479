"""The engine's settings as CLI options, generated from their one declaration (the fields of
engine.config's dataclasses, gathered in ENGINE_SETTINGS) for every command that starts the
engine, so that adding a setting never means typing it again here."""

from __future__ import annotations

import functools
import inspect
import types
import typing
from collections.abc import Callable, Iterable
from typing import Annotated, Any, TypeVar

import typer

from engine.config import ENGINE_SETTINGS, Setting

F = TypeVar("F", bound=Callable[..., Any])
PANEL = "Engine settings"


def engine_options(
    only: Iterable[str] | None = None, *, unset: bool = False, prefix: str = ""
) -> Callable[[F], F]:
    """Add the engine settings (or `only` those) as options of a Typer command, after its own;
    a setting the command declares itself (e.g. `seed`, which seeds more than the engine) stays
    the command's. The command receives them as one `engine` dict keyword: every setting with
    its default, or with `unset`, only those given on the command line (the command's profile
    decides the rest, so every option defaults to None)."""

    def decorate(func: F) -> F:
        signature = inspect.signature(func, eval_str=True)
        own = [p for p in signature.parameters.values() if p.name != "engine"]
        taken = {p.name for p in own}
        names = [n for n in (only or ENGINE_SETTINGS) if n not in taken]
        added = [_parameter(ENGINE_SETTINGS[n], unset, prefix) for n in names]

        @functools.wraps(func)
        def command(**kwargs: Any) -> Any:
            engine = {n: kwargs.pop(n) for n in names}
            if unset:
                engine = {k: v for k, v in engine.items() if v is not None}
            return func(**kwargs, engine=engine)

        command.__signature__ = signature.replace(parameters=own + added)  # type: ignore[attr-defined]
        return command  # type: ignore[return-value]

    return decorate


def option_type(spec: Setting) -> Any:
    """What the command line takes: a Literal's choices as text (validate() names them when
    one is wrong), speculative_config as its JSON text, the rest as declared."""
    base = [a for a in typing.get_args(spec.type) if a is not type(None)] or [spec.type]
    kind = base[0] if len(base) == 1 else spec.type
    if spec.choices or (isinstance(kind, type) and kind not in (bool, int, float, str)):
        kind = str
    return kind | None if spec.optional else kind


def option_help(spec: Setting, prefix: str = "") -> str:
    choices = [c for c in spec.choices if c is not None]
    listed = " | ".join(choices)
    text = spec.help if not listed or spec.help.startswith(choices[0]) else f"{listed}: {spec.help}"
    return prefix + text


def _parameter(spec: Setting, unset: bool, prefix: str) -> inspect.Parameter:
    kind = option_type(spec)
    if unset and not _is_optional(kind):
        kind = kind | None
    option = typer.Option(help=option_help(spec, prefix), rich_help_panel=PANEL)
    default = None if unset else spec.default
    return inspect.Parameter(
        spec.name,
        inspect.Parameter.KEYWORD_ONLY,
        default=default,
        annotation=Annotated[kind, option],
    )


def _is_optional(kind: Any) -> bool:
    return isinstance(kind, types.UnionType) and type(None) in typing.get_args(kind)
