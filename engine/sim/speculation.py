"""Speculative decoding on the simulated engine. There are no tokens to look up or score, so
whether a draft token is accepted is drawn from acceptance rates the user gives (what vLLM
reports per draft position: spec_decode_num_accepted_tokens_per_pos / num_drafts, or one rate
per token), and a draft model's time comes from the step-time model. The engine's own
Speculator, scheduler and verification bookkeeping run unchanged around them."""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from engine.core.request import Request
from engine.model.cost import StepShape


@dataclass(frozen=True, slots=True)
class Acceptance:
    """per_pos[i]: the share of drafts whose position i is accepted (so are 0..i-1: the
    rates never rise). A single rate a per token gives a, a^2, a^3, ... (each draft token
    accepted with probability a if the one before it was)."""

    per_pos: tuple[float, ...] = ()
    per_token: float | None = None

    @classmethod
    def parse(cls, value: float | str | Sequence[float]) -> Acceptance:
        """0.7 (one rate per token), "0.8,0.6,0.45" or [0.8, 0.6, 0.45] (per position)."""
        if isinstance(value, str):
            try:
                rates = [float(v) for v in value.split(",")]
            except ValueError:
                raise ValueError(
                    f"--sim-acceptance {value!r}: a rate (0.7) or rates per draft position, "
                    "comma-separated (0.8,0.6,0.45)"
                ) from None
        elif isinstance(value, bool) or not isinstance(value, (int, float, list, tuple)):
            raise ValueError(f"--sim-acceptance {value!r}: a rate or a list of rates")
        else:
            rates = [float(v) for v in value] if isinstance(value, (list, tuple)) else [value]
        if not rates or any(not 0.0 <= r <= 1.0 for r in rates):
            raise ValueError(f"--sim-acceptance {value!r}: rates lie in [0, 1]")
        if any(b > a for a, b in itertools.pairwise(rates)):
            raise ValueError(
                f"--sim-acceptance {value!r}: per-position rates cannot rise (a position is "
                "accepted only if every one before it is)"
            )
        if len(rates) == 1 and not isinstance(value, (list, tuple)):
            return cls(per_token=rates[0])
        return cls(per_pos=tuple(rates))

    def rates(self, k: int) -> list[float]:
        """Per-position rates of a k-token draft."""
        if self.per_token is not None:
            return [self.per_token ** (i + 1) for i in range(k)]
        if len(self.per_pos) < k:
            raise ValueError(
                f"--sim-acceptance gives {len(self.per_pos)} per-position rates for drafts of "
                f"{k} tokens (num_speculative_tokens): give {k}, or one rate per token"
            )
        return list(self.per_pos[:k])

    def describe(self) -> dict[str, object]:
        if self.per_token is not None:
            return {"per_token": self.per_token}
        return {"per_position": list(self.per_pos)}


def check_draft_share(share: Any) -> float:
    """The share of decodes that get a draft, checked: a number in [0, 1]."""
    number = isinstance(share, (int, float)) and not isinstance(share, bool)
    if not (number and 0 <= share <= 1):
        raise ValueError(f"--sim-draft-share {share!r}: a share of decodes, in [0, 1]")
    return float(share)


class SimProposer:
    """Stands in for the config's proposer: a decoding request asked for a draft gets one
    with probability `draft_share` (n-gram lookup finds no match for the rest; a draft model
    always proposes), as many tokens as it is allowed, all of them the simulated model's one
    token. A draft model's proposals cost `num_draft_layers / num_layers` of a
    decode step of the drafting requests, one per draft position (the real draft runs its
    layers, final norm and LM head once per position); prompt lookup costs nothing."""

    def __init__(
        self,
        acceptance: Acceptance,
        k: int,
        seed: int,
        token_id: int,
        step_time: Callable[[StepShape], float] | None = None,
        layer_share: float = 0.0,
        draft_share: float = 1.0,
    ) -> None:
        self.draft_share = check_draft_share(draft_share)
        self.conditional = _conditional(acceptance.rates(k))
        self.rng = random.Random(seed)
        self.token_id = token_id
        self.step_time = step_time
        self.layer_share = layer_share
        self.last_draft_s = 0.0  # the latest propose()'s drafting time

    def num_wanted(self, req: Request, k: int) -> int:
        share = self.draft_share
        return k if share >= 1.0 or self.rng.random() < share else 0

    def propose(self, batch: list[tuple[Request, int]]) -> None:
        for req, granted in batch:
            req.spec_token_ids = [self.token_id] * granted
        self.last_draft_s = 0.0
        if self.step_time is None:
            return
        for j in range(max(k for _, k in batch)):
            active = [req for req, k in batch if k > j]
            n = len(active)
            keys = sum(req.num_tokens + j for req in active)  # each attends its KV and itself
            shape = StepShape(0, n, n, keys, keys, 0, n)
            self.last_draft_s += self.layer_share * self.step_time(shape)

    def accepted(self, drafts: int) -> int:
        """How many of a request's `drafts` tokens the verifier keeps (a prefix)."""
        rng = self.rng.random
        for i in range(drafts):
            if rng() >= self.conditional[i]:
                return i
        return drafts


def _conditional(rates: list[float]) -> list[float]:
    """P(position i accepted | 0..i-1 were), from the per-position shares."""
    out, before = [], 1.0
    for r in rates:
        out.append(r / before if before > 0 else 0.0)
        before = r
    return out
