"""Parallel sampling (a request's `n` > 1): the request becomes n children that share its
prompt, and the siblings wait until the first child has cached the prompt's full blocks, so
that they compute only its partial last block (vLLM keeps the same apart, in
v1/engine/parallel_sampling.py). The engine holds the children and the held ones."""

from __future__ import annotations

import dataclasses
from typing import Protocol

from engine.config import EngineConfig
from engine.core.request import Request

CHILD_SEP = "\x1f"  # parent id + this + index: a child's id (no client writes it)


class Queue(Protocol):
    def add(self, req: Request, front: bool = False) -> None: ...


def fan_out(req: Request, eos_token_ids: tuple[int, ...]) -> list[Request]:
    """A request of n > 1 becomes n children with their own ids and indices; a seed gives
    child i the seed + i (each its own stream of random numbers, as vLLM does), wrapped to 64
    bits: torch seeds a generator with the value mod 2**64 anyway, and 2**64 - 1 + 1 would
    overflow it."""
    n = req.params.n
    if n == 1:
        return [req]
    children = []
    for i in range(n):
        params = dataclasses.replace(req.params, n=1)
        if params.seed is not None:
            params.seed = (req.params.seed + i) % 2**64
        child = Request(
            f"{req.request_id}{CHILD_SEP}{i}",
            req.prompt_token_ids,
            params,
            req.prompt,
            req.metrics.arrival_time,
            eos_token_ids,
            req.priority,
        )
        child.parent_id, child.index = req.request_id, i
        children.append(child)
    return children


def shares_prompt(config: EngineConfig, req: Request) -> bool:
    """Whether the siblings wait for the first child's prompt blocks: they then start from
    them and compute only the prompt's partial last block (copy by recompute). Without the
    cache (or in static batches), or with no full block to share, all start at once."""
    bs = config.cache.block_size
    return (
        config.cache.enable_prefix_caching
        and config.scheduler.batching == "continuous"
        and (req.num_prompt_tokens - 1) // bs > 0
    )


def release_held(
    held: dict[str, list[Request]],
    children: dict[str, list[Request]],
    queue: Queue,
    block_size: int,
) -> None:
    """Siblings whose first child has computed the shared prompt blocks (or ended) join the
    queue ahead of later arrivals: they arrived with it."""
    for parent, waiting in list(held.items()):
        first = children[parent][0]
        if first.is_finished or first.num_computed_tokens >= (
            (first.num_prompt_tokens - 1) // block_size * block_size
        ):
            for child in reversed(waiting):
                if not child.is_finished:
                    queue.add(child, front=True)
            del held[parent]
