"""Every claim `bench claims` knows, in the brief's order, and `--only`'s selection."""

from __future__ import annotations

from bench_cli.claims.claim import Claim
from bench_cli.claims.features import PRIORITY, SHARING, SPECULATIVE, TENSOR_PARALLEL
from bench_cli.claims.kernels import FUSED
from bench_cli.claims.memory import FP8, PAGING
from bench_cli.claims.scheduling import BATCHING, CHUNKING, VS_NAIVE

CLAIMS: list[Claim] = [
    PAGING,
    BATCHING,
    CHUNKING,
    VS_NAIVE,
    FP8,
    FUSED,
    SHARING,
    PRIORITY,
    SPECULATIVE,
    TENSOR_PARALLEL,
]


def select(only: str | None) -> list[Claim]:
    """`--only 1,3,7b`: claims by id, or by number (7: 7a to 7d); None: all."""
    if not only:
        return list(CLAIMS)
    wanted = [w.strip() for w in only.split(",") if w.strip()]
    known = {c.id for c in CLAIMS} | {c.number for c in CLAIMS}
    unknown = [w for w in wanted if w not in known]
    if unknown:
        ids = ", ".join(c.id for c in CLAIMS)
        raise ValueError(f"--only {only}: no claim {', '.join(unknown)}; claims: {ids}")
    return [c for c in CLAIMS if c.id in wanted or c.number in wanted]
