"""The arrival registry seen as a run's flat settings: a parameter's value or what is
recorded when it is not given, the flat layout of results files, which keys belong to a
process other than the one chosen (refused when given, dropped when a profile's), and the
run's arrival checks (kept out of loadgen/config.py, which reads them)."""

from __future__ import annotations

import dataclasses
from typing import Any

from loadgen.arrivals.base import (
    ArrivalProcess,
    arrival_process,
    owner,
    param_fields,
    processes,
)


def arrival_param(params: dict[str, Any], name: str) -> Any:
    """A given arrival parameter, else what is recorded when it is not given."""
    spec = param_fields().get(name)
    if spec is None:
        raise AttributeError(name)
    return params.get(name, spec.metadata["unset"])


def flat_params(settings: dict[str, Any], in_classes: bool = True) -> dict[str, Any]:
    """A settings dict with its `arrival_params` spread out after `rate`, every parameter
    there (given or unset): the layout results files have always had."""
    params = settings.get("arrival_params") or {}
    out: dict[str, Any] = {}
    for key, value in settings.items():
        if key != "arrival_params":
            out[key] = value
        if key == "rate":
            for name in param_fields(in_classes=in_classes):
                out[name] = arrival_param(params, name)
    return out


def process_or_none(arrival: str) -> type[ArrivalProcess] | None:
    """The registered process, or None (validate() says what is wrong with the name)."""
    try:
        return arrival_process(arrival)
    except ValueError:
        return None


def is_rated(arrival: str) -> bool:
    process = process_or_none(arrival)
    return process.rated if process else True


def is_foreign(key: str, arrival: str) -> bool:
    """A key of some arrival process that `arrival` does not have (the rate, for a process
    that sets its own pace)."""
    process = process_or_none(arrival)
    if process is None:
        return False
    if key == "rate":
        return not process.rated
    return owner(key) is not None and key not in process.own_keys()


def check_arrival(run: Any) -> None:
    """A run's arrival settings checked by its process (`run`: a RunConfig): the name, the
    keys of other processes (refused: they would be ignored), its parameters' values, a
    ramp-up (of a rated process only), and what else the process cannot go with."""
    process = arrival_process(run.arrival)
    defaults = {f.name: f.default for f in dataclasses.fields(run)}
    for other in processes():
        for key in other.run_keys:
            if other is not process and getattr(run, key) != defaults[key]:
                raise ValueError(other.refuse(key, run.arrival))
    for key in run.arrival_params:
        mine = owner(key)
        if key not in process.own_keys() and mine is not None:
            raise ValueError(mine.refuse(key, run.arrival))
    process.check_params(run.arrival_params)
    if run.ramp_up_strategy is not None:
        if not process.rated:
            raise ValueError(f"a ramp-up moves a rate: {run.arrival} arrivals have none")
        if run.rate is not None:
            raise ValueError("a ramp-up sets the rate: --rate cannot go with it")
        run.ramp()
    elif run.ramp_up_start_rps is not None or run.ramp_up_end_rps is not None:
        raise ValueError("--ramp-up-start-rps/--ramp-up-end-rps need --ramp-up-strategy")
    process.check_run(run)
