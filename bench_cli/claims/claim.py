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
class Scale:
    """How big the experiments are: quick (the tiny model, small loads: what the tests run)
    or full (SmolLM2, loads that take minutes); and the server a claim about servers meets."""

    quick: bool
    model: str
    base_url: str | None = None

    @classmethod
    def of(cls, quick: bool, model: str | None, base_url: str | None) -> Scale:
        return cls(quick, model or (QUICK_MODEL if quick else FULL_MODEL), base_url)

    def pick(self, quick: Any, full: Any) -> Any:
        return quick if self.quick else full

    def profile(self, name: str, **keys: Any) -> dict[str, Any]:
        """A sweep profile's keys: the model, a warm-up request, and (quick) eager attention,
        whose start-up skips torch.compile's seconds; then the claim's own keys."""
        base: dict[str, Any] = {"name": name, "model": self.model, "warmup": 1}
        if self.quick:
            base["enforce_eager"] = True
        return base | keys


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
    about_server: bool = False  # measurable against --base-url (else it sets engine settings)
    minutes: tuple[float, float] = (0.3, 3.0)  # expected duration, quick and full, 2-core CPU
    notes: list[str] = field(default_factory=list)

    @property
    def number(self) -> str:
        return self.id.rstrip("abcdefgh")
