"""The arrival registry's own rules (loadgen/arrivals/base.py) and the refusals the run's
config now takes from the processes: a key of another process, a bad parameter before any
file is read, a ramp-up of a process without a rate."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import pytest

from loadgen.arrivals import ArrivalProcess, arrival_names, param, register
from loadgen.arrivals.gamma import Gamma
from loadgen.config import RunConfig
from loadgen.profiles import build_config

TRACE = {"arrival": "trace", "trace": "t.jsonl"}


def build(profile: dict[str, Any], **flags: Any) -> RunConfig:
    return build_config(profile, flags, set())


def test_the_builtin_processes_are_listed_default_first() -> None:
    assert arrival_names() == ("poisson", "gamma", "constant", "trace")
    assert arrival_names(in_classes=True) == ("poisson", "gamma", "constant")


@pytest.mark.parametrize(
    ("profile", "message"),
    [
        ({**TRACE, "time_scale": -1.0}, "time scale must be > 0, got -1.0"),
        ({"arrival": "gamma", "rate": 1.0, "num_requests": 3, "burstiness": 0}, "burstiness"),
        ({"rate": 1.0, "num_requests": 3, "trace_format": "azure"}, "--trace-format shapes trace"),
        (
            {**TRACE, "ramp_up_strategy": "linear", "ramp_up_start_rps": 1, "ramp_up_end_rps": 2},
            "a ramp-up moves a rate: trace arrivals have none",
        ),
    ],
)
def test_the_config_refuses_what_the_process_would_not_run(
    profile: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        build(profile)


def test_a_name_or_a_parameter_is_registered_once() -> None:
    with pytest.raises(ValueError, match="the name is taken"):
        register(Gamma)

    @dataclass(frozen=True, slots=True)
    class OtherShape(ArrivalProcess):
        name = "other"
        burstiness: float = param(2.0, "another meaning")

    with pytest.raises(ValueError, match="'burstiness' is declared differently twice"):
        register(OtherShape)
    assert "other" not in arrival_names()
