"""`bench gate --ratio`: a metric at one setting against the same metric at another, within a
sweep ('output_throughput[batching=continuous]/output_throughput[batching=static]>=2')."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from bench_cli.gate.checks import Check, direction, refused, untrusted
from bench_cli.gate.results import GateInputError, Results, typed, value_of


@dataclass(frozen=True, slots=True)
class Ratio:
    """`output_throughput[batching=continuous]/output_throughput[batching=static]>=2`: a
    ratio inside one sweep, at every value of its other axes; free of machine speed."""

    metric: str
    top: dict[str, str]  # axis -> value, as written
    bottom: dict[str, str]
    op: str
    bound: float
    text: str

    @classmethod
    def parse(cls, text: str) -> Ratio:
        m = re.fullmatch(
            r"\s*([\w.]+)\[([^\]]+)\]\s*/\s*([\w.]+)\[([^\]]+)\]\s*(>=|<=)\s*([\d.]+)\s*", text
        )
        if m is None or m[1] != m[3]:
            raise GateInputError(
                f"ratio {text!r}: expected METRIC[axis=value]/METRIC[axis=value]>=NUMBER"
            )
        direction(m[1])
        return cls(m[1], _selector(m[2], text), _selector(m[4], text), m[5], float(m[6]), text)

    def evaluate(self, results: Results, allow_invalid: bool = False) -> list[Check]:
        chosen = set(self.top) | set(self.bottom)
        unknown = chosen - set(results.axes)
        if unknown:
            raise GateInputError(f"ratio {self.text!r}: {sorted(unknown)} not axes of the sweep")
        rest = [a for a in results.axes if a not in chosen]
        groups: dict[tuple, dict[str, list[dict[str, Any]]]] = {}
        for row in results.rows:
            for side, sel in (("top", self.top), ("bottom", self.bottom)):
                if all(typed(row[k]) == typed(v) for k, v in sel.items()):
                    group = groups.setdefault(tuple(typed(row[a]) for a in rest), {})
                    group.setdefault(side, []).append(row)
        if not groups:
            raise GateInputError(f"ratio {self.text!r}: no point has both sides in {results.where}")
        checks = []
        for sides in groups.values():
            some = next(iter(sides.values()))[0]
            point = " ".join(f"{a}={some[a]}" for a in rest)
            top, bottom = (self._one(sides, side, point, results) for side in ("top", "bottom"))
            notes = [
                n
                for r in (top, bottom)
                if (n := untrusted(r, f"{results.where} {results.label(r)}", allow_invalid))
            ]
            if notes:
                checks.append(refused(self.text, point, self.bound, notes))
                continue
            checks.append(self._check(top, bottom, point, results.where))
        return checks

    def _one(
        self, sides: dict[str, list[dict[str, Any]]], side: str, point: str, results: Results
    ) -> dict[str, Any]:
        """The single row one side selects at this point: none or several is unusable."""
        rows = sides.get(side, [])
        sel = ",".join(f"{k}={v}" for k, v in (self.top if side == "top" else self.bottom).items())
        at = f" at {point}" if point else ""
        if not rows:
            raise GateInputError(
                f"ratio {self.text!r}: no row of {results.where} matches [{sel}]{at}"
            )
        if len(rows) > 1:
            names = "; ".join(results.label(r) for r in rows)
            raise GateInputError(
                f"ratio {self.text!r}: [{sel}]{at} matches {len(rows)} rows ({names}); "
                "name more axes in the selector"
            )
        return rows[0]

    def _check(
        self, top_row: dict[str, Any], bottom_row: dict[str, Any], point: str, where: str
    ) -> Check:
        at = f"{where} {point}".strip()
        top = value_of(top_row, self.metric, at)
        bottom = value_of(bottom_row, self.metric, at)
        if top == 0 or bottom == 0:  # nothing measured on one side: no ratio to trust
            side = "denominator" if bottom == 0 else "numerator"
            note = f"{self.text}{' at ' + point if point else ''}: the {side} is 0"
            return Check(self.text, point, bottom, top, math.nan, self.bound, False, note=note)
        ratio = top / bottom
        ok = ratio >= self.bound if self.op == ">=" else ratio <= self.bound
        return Check(self.text, point, bottom, top, ratio, self.bound, ok)


def _selector(text: str, whole: str) -> dict[str, str]:
    out = {}
    for part in text.split(","):
        key, sep, value = part.partition("=")
        if not sep:
            raise GateInputError(f"ratio {whole!r}: {part!r} is not axis=value")
        out[key.strip()] = value.strip()
    return out
