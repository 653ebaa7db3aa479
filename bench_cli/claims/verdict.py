"""Verdicts: the brief's numbers turned into rules fixed before anything runs.

A claim of "k times" holds when the measured factor reaches 90 % of k (10 % for the noise of
one run on a shared machine), is partly true above 1.1x (better, but less than claimed) and
does not hold below. A claim of "over P %" holds at P or more and is partly true above a tenth
of P. Where the brief gives no number, the claim's own thresholds say what we took, in
claims.json and the table, next to the figures."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

HOLDS = "holds"
PARTLY = "partly"
FAILS = "does not hold here"
UNMEASURABLE = "not measurable here"
SLACK = 0.9  # a k-times claim holds at 0.9 k
BETTER = 1.1  # ... and is partly true above this factor


@dataclass(slots=True)
class Part:
    """One checkable part of a claim: what was measured against what threshold."""

    what: str  # "KV wasted by max-length reservation"
    measured: str  # "71 %"
    threshold: str  # ">= 60 %"
    verdict: str


@dataclass(slots=True)
class Finding:
    verdict: str
    measured: str  # one line for the table
    why: str = ""  # what the verdict rests on, or why nothing could be measured
    parts: list[Part] = field(default_factory=list)
    figures: dict[str, Any] = field(default_factory=dict)  # every number, for claims.json
    charts: list[dict[str, Any]] = field(default_factory=list)  # the evidence: see chart()

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Finding:
        parts = [Part(**p) for p in data.get("parts", [])]
        return cls(**(data | {"parts": parts}))


def unmeasurable(why: str) -> Finding:
    return Finding(UNMEASURABLE, "-", why)


def factor(measured: float | None, claimed: float) -> str:
    if measured is None:
        return UNMEASURABLE
    if measured >= SLACK * claimed:
        return HOLDS
    return PARTLY if measured > BETTER else FAILS


def at_least(measured: float | None, target: float, partly_above: float) -> str:
    """`measured` >= target holds; above `partly_above` partly; else does not hold."""
    if measured is None:
        return UNMEASURABLE
    if measured >= target:
        return HOLDS
    return PARTLY if measured > partly_above else FAILS


def combine(parts: list[Part]) -> str:
    """Every part holds: the claim holds; none holds or is partly true: it does not."""
    verdicts = [p.verdict for p in parts if p.verdict != UNMEASURABLE]
    if not verdicts:
        return UNMEASURABLE
    if all(v == HOLDS for v in verdicts):
        return HOLDS
    if all(v == FAILS for v in verdicts):
        return FAILS
    return PARTLY


def finding(
    parts: list[Part], figures: dict[str, Any], why: str, charts: list[dict[str, Any]]
) -> Finding:
    """The claim's verdict from its parts; the table line names each part's figure, and a
    claim true only in part says which parts hold."""
    verdict = combine(parts)
    measured = "; ".join(f"{p.what} {p.measured}" for p in parts)
    if verdict == PARTLY:
        held = [p.what for p in parts if p.verdict == HOLDS]
        why = (f"holds for: {', '.join(held)}. " if held else "") + why
    return Finding(verdict, measured, why, parts, figures, charts)


def chart(
    title: str, y: str, x: list[Any], series: dict[str, list[Any]], kind: str = "bar"
) -> dict[str, Any]:
    """One figure of the evidence, as data (claims.html draws it): `series` maps a name to
    its values at `x`; kind bar (grouped) or line."""
    return {"title": title, "y": y, "x": [str(v) for v in x], "series": series, "kind": kind}


def pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.0f} %"


def times(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.2f}x"


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None
