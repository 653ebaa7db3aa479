"""A claim: the brief's words, the sweep that tests them, the thresholds fixed before it runs,
and the judge that turns the sweep's figures into a verdict."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench_cli.claims.evidence import Point
from bench_cli.claims.verdict import Finding

QUICK_MODEL = "tiny-smollm2"  # random weights behind SmolLM2's tokenizer: tests the machinery
FULL_MODEL = "smollm2-135m"


@dataclass(frozen=True, slots=True)
class Simulation:
    """Claims run on the simulated engine (`bench run --engine sim`'s settings). The claims'
    loads are sized for their model on this machine's engine; `rate_factor` is how much faster
    the simulated model and device serve, and every arrival rate is multiplied by it, so each
    load keeps the utilization it was designed for (closed loops need no scaling)."""

    device: str = "local"
    cost_model: str | None = None  # None: calibrated where a profile is found, else roofline
    profile: str | None = None
    tensor_parallel_size: int = 1
    rate_factor: float = 1.0

    @property
    def where(self) -> str:
        tp = self.tensor_parallel_size
        return f"{tp} x {self.device}" if tp > 1 else self.device

    def keys(self) -> dict[str, Any]:
        keys = {"engine": "sim", "sim_device": self.device, "sim_cost_model": self.cost_model}
        keys |= {"sim_profile": self.profile}
        if self.tensor_parallel_size > 1:
            keys["tensor_parallel_size"] = self.tensor_parallel_size
        return {k: v for k, v in keys.items() if v is not None}


@dataclass(frozen=True, slots=True)
class Scale:
    """How big the experiments are: quick (the tiny model, small loads: what the tests run)
    or full (SmolLM2, loads that take minutes); the server a claim about servers meets; and
    whether the engine is simulated; the schedule lag a run may have before it is INVALID
    (None: the load generator's default)."""

    quick: bool
    model: str
    base_url: str | None = None
    sim: Simulation | None = None
    max_p99_lag_ms: float | None = None

    @classmethod
    def of(
        cls,
        quick: bool,
        model: str | None,
        base_url: str | None,
        sim: Simulation | None = None,
        max_p99_lag_ms: float | None = None,
    ) -> Scale:
        model = model or (QUICK_MODEL if quick else FULL_MODEL)
        return cls(quick, model, base_url, sim, max_p99_lag_ms)

    def pick(self, quick: Any, full: Any) -> Any:
        return quick if self.quick else full

    def profile(self, name: str, **keys: Any) -> dict[str, Any]:
        """A sweep profile's keys: the model, a warm-up request, and (quick) eager attention,
        whose start-up skips torch.compile's seconds; then the claim's own keys; simulated,
        the simulation's keys and every arrival rate scaled."""
        base: dict[str, Any] = {"name": name, "model": self.model, "warmup": 1}
        if self.quick and self.sim is None:
            base["enforce_eager"] = True
        if self.max_p99_lag_ms is not None:
            base["max_p99_lag_ms"] = self.max_p99_lag_ms
        if self.sim is None:
            return base | keys
        return scale_rates(base | keys, self.sim.rate_factor) | self.sim.keys()


RATE_KEYS = ("rate", "ramp_up_start_rps", "ramp_up_end_rps")


def _scaled(rate: float, factor: float) -> float:
    return rate if factor == 1 else float(f"{rate * factor:.3g}")  # 3 digits: names of points


def scale_rates(keys: Any, factor: float) -> Any:
    """A profile's keys with every arrival rate (a number or a list of them, at any depth:
    classes, sweep axes) multiplied by factor."""
    if isinstance(keys, list):
        return [scale_rates(v, factor) for v in keys]
    if not isinstance(keys, dict):
        return keys
    out = {}
    for k, v in keys.items():
        if k in RATE_KEYS and isinstance(v, int | float):
            out[k] = _scaled(v, factor)
        elif k in RATE_KEYS and isinstance(v, list):
            out[k] = [_scaled(r, factor) if isinstance(r, int | float) else r for r in v]
        else:
            out[k] = scale_rates(v, factor)
    return out


Judge = Callable[[list[Point], Scale, Path], Finding]


@dataclass(frozen=True, slots=True)
class Claim:
    id: str  # "1", "7a": --only takes ids or their number ("7": 7a..7d)
    slug: str  # its folder: 1-paging
    title: str
    brief: str  # the brief's own words
    thresholds: dict[str, str]  # what each verdict needs, stated before anything runs
    sweep: Callable[[Scale], dict[str, Any]] | None = None  # the profile, with its "sweep" axes
    judge: Judge | None = None
    # a measurement beside the sweep (accuracy, the device's peak): its dict is kept as
    # measured.json in the claim's folder and read back by the judge
    measure: Callable[[Scale], dict[str, Any]] | None = None
    missing: str | None = None  # the engine feature it needs is not there yet: why
    not_simulated: str | None = None  # why a simulated engine cannot show it (None: it can)
    only_simulated: str | None = None  # why only a simulation can show it here
    about_server: bool = False  # measurable against --base-url (else it sets engine settings)
    minutes: tuple[float, float] = (0.3, 3.0)  # expected duration, quick and full, 2-core CPU
    notes: list[str] = field(default_factory=list)
    # The model its loads run where not the claims' own (7d: one too big for one device)
    model: Callable[[Scale], str] | None = None

    @property
    def number(self) -> str:
        return self.id.rstrip("abcdefgh")

    def runs_at(self, scale: Scale) -> bool:
        """Whether it can be measured (or simulated) at this scale, or is only reported."""
        if scale.sim is not None and self.not_simulated:
            return False
        if scale.sim is None and self.only_simulated:
            return False
        return self.missing is None and (scale.base_url is None or self.about_server)


def models_run(claims: list[Claim], scale: Scale) -> str:
    """The models these claims' loads run, as headers name them: the claims' own model, and
    a claim's other one beside it ("smollm2-135m; 7d meta-llama/Llama-3.1-70B")."""
    running = [c for c in claims if c.runs_at(scale)]
    own = {c.id: c.model(scale) for c in running if c.model is not None}
    other = {i: m for i, m in own.items() if m != scale.model}
    names = [scale.model] if len(other) < len(running) or not running else []
    return "; ".join([*names, *(f"{i} {m}" for i, m in other.items())])
