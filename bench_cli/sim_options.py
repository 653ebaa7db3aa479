"""The simulated engine's flags (--engine sim and its --sim-* options), shared by `bench run`,
`bench sweep` and `bench claims`: declared once here."""

from __future__ import annotations

from typing import Annotated

import typer

Opt = typer.Option

# The simulated engine's flags, shared by run and sweep.
EngineKind = Annotated[
    str | None,
    Opt(
        "--engine",
        help="bundled (the real engine) | sim: its scheduler and KV cache on a virtual "
        "clock, each step timed by a cost model (no weights; any model, any device)",
    ),
]
SimDevice = Annotated[
    str | None, Opt(help="sim: a100 | h100 | h200 | b200 | local (this machine, default)")
]
SimCostModel = Annotated[
    str | None,
    Opt(help="sim: calibrated (a bench calibrate profile) | roofline (default without one)"),
]
SimProfile = Annotated[
    str | None, Opt(help="sim: a calibration profile (default: bench calibrate's path)")
]
SimDraftShare = Annotated[
    str | None,
    Opt(
        help="sim, speculative decoding: the share of decodes the proposer finds a draft for "
        "(n-gram lookup misses the rest; default 1), or per-request shares, 0.1,0.9,1 (each "
        "request takes one: n-gram hits cluster in requests; a run's summary gives them)"
    ),
]
SimAcceptance = Annotated[
    str | None,
    Opt(
        help="sim, speculative decoding: the verifier's acceptance of draft tokens, a rate "
        "per token (0.7) or vLLM's rates per draft position (0.8,0.6,0.45)"
    ),
]
