"""The arrival processes' parameters as `bench run` options, generated from their registry
(loadgen/arrivals): --burstiness, --time-scale and any process's own, with the --arrival
choices listed from it, so that adding a process never means typing its flags here. The
flags keep their flat (vLLM) names; which process a flag belongs to is checked by the run's
config; --class lists the keys of a class from it too."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Annotated, Any, TypeVar

import typer

from loadgen.arrivals import arrival_names, arrival_process, param_fields, param_type
from loadgen.traffic import class_keys

F = TypeVar("F", bound=Callable[..., Any])


def arrival_help() -> str:
    """The --arrival option's help: each process named with its one-line description."""
    return "; ".join(f"{n}: {arrival_process(n).description}" for n in arrival_names())


def arrival_options(func: F) -> F:
    """Add every registered arrival parameter (default None: not given) as an option of a
    Typer command with an `arrival` option, and list the processes in that option's help;
    the command receives the parameters given as one `arrival_params` dict keyword."""
    signature = inspect.signature(func, eval_str=True)
    own = [_with_choices(p) for p in signature.parameters.values() if p.name != "arrival_params"]
    taken = {p.name for p in own}
    names = [n for n in param_fields() if n not in taken]
    added = [_parameter(n) for n in names]

    @functools.wraps(func)
    def command(**kwargs: Any) -> Any:
        params = {n: kwargs.pop(n) for n in names}
        return func(**kwargs, arrival_params={k: v for k, v in params.items() if v is not None})

    at = next((i + 1 for i, p in enumerate(own) if p.name == "rate"), len(own))
    parameters = own[:at] + added + own[at:]  # after --rate, where users look for them
    command.__signature__ = signature.replace(parameters=parameters)  # type: ignore[attr-defined]
    return command  # type: ignore[return-value]


def _with_choices(p: inspect.Parameter) -> inspect.Parameter:
    """--arrival lists the processes; --class lists the keys a class may set."""
    if p.name == "arrival":
        return p.replace(annotation=Annotated[str | None, typer.Option(help=arrival_help())])
    if p.name == "traffic_class":
        keys = ", ".join(class_keys())
        text = (
            "a traffic class, repeatable: NAME:key=value,... with the keys of a [[class]] "
            f"table ({keys}); unset keys are the run's"
        )
        return p.replace(annotation=Annotated[list[str] | None, typer.Option("--class", help=text)])
    return p


def _parameter(name: str) -> inspect.Parameter:
    option = typer.Option(help=param_fields()[name].metadata["help"])
    return inspect.Parameter(
        name,
        inspect.Parameter.POSITIONAL_OR_KEYWORD,  # placed among the command's own
        default=None,
        annotation=Annotated[param_type(name) | None, option],
    )
