"""Speculative decoding on the simulated engine. There are no tokens to look up or score, so
whether a draft token is accepted is drawn from acceptance rates the user gives (what vLLM
reports per draft position: spec_decode_num_accepted_tokens_per_pos / num_drafts, or one rate
per token), and a draft model's time comes from the step-time model. The engine's own
Speculator, scheduler and verification bookkeeping run unchanged around them."""

from __future__ import annotations

import itertools
import random
import zlib
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


@dataclass(frozen=True, slots=True)
class DraftShare:
    """The share of a request's decodes that get a draft: one for every request (0.6), or
    several (0.1,0.9,1.0,...), of which each request takes one, always the same for it. An
    n-gram proposer finds drafts in the requests whose reply repeats their prompt, not evenly:
    one share makes every request about equally fast; per-request shares measured on a real
    run (`per_request_shares`) keep its spread of tokens a step (how close each came:
    docs/results/2026-12-05-sim-accuracy.md)."""

    shares: tuple[float, ...] = (1.0,)

    @classmethod
    def parse(cls, value: float | str | Sequence[float] | None) -> DraftShare:
        if value is None:
            return cls()
        if isinstance(value, str):
            try:
                items: list[Any] = [float(v) for v in value.split(",")]
            except ValueError:
                raise ValueError(
                    f"--sim-draft-share {value!r}: a share of decodes (0.6), or per-request "
                    "shares, comma-separated (0.1,0.9,1)"
                ) from None
        elif isinstance(value, (list, tuple)) and value:
            items = list(value)
        else:
            items = [value]
        return cls(tuple(check_draft_share(v) for v in items))

    @property
    def mean(self) -> float:
        return sum(self.shares) / len(self.shares)

    def of(self, request_id: str, seed: int) -> float:
        """A request's share: drawn from `shares` by its id (and the run's seed)."""
        if len(self.shares) == 1:
            return self.shares[0]
        return self.shares[zlib.crc32(f"{seed}:{request_id}".encode()) % len(self.shares)]

    def describe(self) -> float | dict[str, Any]:
        if len(self.shares) == 1:
            return self.shares[0]
        return {"mean": self.mean, "per_request": list(self.shares)}


def per_request_shares(
    chunk_tokens: Sequence[Sequence[int]], acceptance: Acceptance, k: int, mean: float | None = None
) -> list[float]:
    """Each request's share of decodes given a draft, from its streamed chunks (one a step,
    carrying 1 + the accepted draft tokens): (tokens a decode step - 1) / the mean accepted
    tokens of a draft, clipped to [0, 1]; requests with fewer than two decode steps left out.
    The inverse of what `SimProposer` does with a share, so a simulation given these
    reproduces the real run's spread of per-request speeds. `mean`: the run's overall share
    where it was counted (our engine counts lookups, one a decode step): the shares are
    scaled so that their mean over decode steps is it, as a request's luck in acceptance
    would otherwise read as a share, and clipping at 1 would bias them."""
    accepted = sum(acceptance.rates(k))
    if accepted <= 0:
        return []
    decoding = [tokens for tokens in chunk_tokens if len(tokens) >= 3]
    steps = [len(tokens) - 1 for tokens in decoding]  # the first chunk is the prefill's
    raw = [((sum(t) - t[0]) / n - 1) / accepted for t, n in zip(decoding, steps, strict=True)]
    by_step = sum(x * n for x, n in zip(raw, steps, strict=True))
    scale = mean * sum(steps) / by_step if mean is not None and by_step > 0 else 1.0
    return [round(min(1.0, max(0.0, x * scale)), 4) for x in raw]


class SimProposer:
    """Stands in for the config's proposer: a decoding request asked for a draft gets one
    with probability its `draft_share` (n-gram lookup finds no match for the rest; a draft model
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
        draft_share: DraftShare | None = None,
    ) -> None:
        self.draft_share = draft_share or DraftShare()
        self.conditional = _conditional(acceptance.rates(k))
        self.seed = seed
        self.rng = random.Random(seed)
        self.token_id = token_id
        self.step_time = step_time
        self.layer_share = layer_share
        self.last_draft_s = 0.0  # the latest propose()'s drafting time

    def num_wanted(self, req: Request, k: int) -> int:
        share = self.draft_share.of(req.parent_id, self.seed)
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
