"""The same seed gives the same schedule, bit for bit, across refactors: the first offsets of
each arrival process (and of a ramp and a class mix, through the run's config and plan) as the
code computed them before arrival processes became registered classes (issue 42)."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from engine.model.loader import load_tokenizer
from loadgen.arrivals import Arrivals, Ramp
from loadgen.plan import build_plan
from loadgen.profiles import build_config

LENGTHS = {"input_len": "8", "output_len": "4"}
POISSON = [0.0, 0.17688231394798037, 0.4331831510217066, 0.5753203153675195, 0.7990977812663103]
GAMMA = [0.0, 0.016530297040113103, 0.03841242353852975, 0.04337148108441879, 2.7161073477813855]
CONSTANT = [0.0, 0.3333333333333333, 0.6666666666666666, 1.0, 1.3333333333333333]
GAMMA_EXP_RAMP = [
    0.0,
    1.7641351047838691,
    2.164851739673318,
    2.2855135809692695,
    2.2969217561007573,
]
POISSON_LINEAR_RAMP = [
    0.0,
    0.04000538642837812,
    0.12659580277809007,
    0.3505223560771682,
    0.6255408680498408,
]
CLASS_MIX = [
    0.0,
    0.0,
    0.0,
    0.3333333333333333,
    0.48906441230131864,
    0.48921220110861197,
    0.5207190162689834,
    0.6391161280715855,
    0.6666666666666666,
]


def first(arrivals: Arrivals, n: int = 5) -> list[float]:
    return list(itertools.islice(arrivals.offsets(), n))


@pytest.mark.parametrize(
    ("arrivals", "expected"),
    [
        (Arrivals("poisson", rate=4.0, seed=7), POISSON),
        (Arrivals("gamma", rate=2.0, burstiness=0.5, seed=11), GAMMA),
        (Arrivals("constant", rate=3.0, seed=5), CONSTANT),
        (
            Arrivals("trace", trace_offsets=(0.0, 0.25, 0.25, 1.5), time_scale=0.5),
            [0, 0.125, 0.125, 0.75],
        ),
        (
            Arrivals("poisson", rate=8.0, seed=3, ramp=Ramp("linear", 1.0, 8.0, 5)),
            POISSON_LINEAR_RAMP,
        ),
        (
            Arrivals(
                "gamma", rate=8.0, burstiness=2.0, seed=3, ramp=Ramp("exponential", 1.0, 8.0, 5)
            ),
            GAMMA_EXP_RAMP,
        ),
    ],
)
def test_a_seed_gives_the_schedule_it_always_gave(arrivals: Arrivals, expected: list) -> None:
    assert first(arrivals) == expected


def test_gaps_past_the_first_block_are_unchanged() -> None:
    """Gaps are drawn 1,024 at a time: the 1,030th offset crosses into the second block."""
    offsets = list(itertools.islice(Arrivals("poisson", rate=4.0, seed=7).offsets(), 1030))
    assert offsets[-1] == 252.28873122736744


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return load_tokenizer("smollm2-135m")


@pytest.mark.parametrize(
    ("profile", "flags", "expected"),
    [
        ({"rate": 4.0, "seed": 7}, {}, POISSON),
        ({"arrival": "gamma", "rate": 2.0, "burstiness": 0.5, "seed": 11}, {}, GAMMA),
        ({"arrival": "constant", "rate": 3.0}, {}, CONSTANT),
        (
            {
                "arrival": "gamma",
                "burstiness": 2.0,
                "ramp_up_strategy": "exponential",
                "ramp_up_start_rps": 1.0,
                "ramp_up_end_rps": 8.0,
                "seed": 3,
            },
            {},
            GAMMA_EXP_RAMP,
        ),
        (
            {"rate": 1.0, "num_requests": 3, "seed": 5},
            {
                "classes": [
                    "a:rate=2",
                    "b:arrival=gamma,burstiness=0.5,rate=4",
                    "c:arrival=constant,rate=3",
                ]
            },
            CLASS_MIX,
        ),
    ],
)
def test_a_runs_plan_keeps_its_schedule(
    profile: dict, flags: dict, expected: list, tokenizer: Any
) -> None:
    cfg = build_config({"num_requests": 5, **LENGTHS, **profile}, flags, set())
    assert build_plan(cfg, tokenizer).plan.offsets == expected
