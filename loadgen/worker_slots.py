"""How `--workers N` shares `--concurrency C`: worker i gets C // N slots, one more for
i < C % N (as inference-perf's and vllm bench's multi-process modes split them), so the
server never sees more than C in flight.

An open loop with a cap sends arrivals to the workers in proportion to their slots. A closed
loop has no schedule to split: the driver hands its requests out as the workers ask for them
(`Dispenser`), a few ahead of each worker's free slots, so `--num-requests` counts over the
whole run and a faster worker simply asks more often."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from loadgen.sessions import Session
from loadgen.workload import RequestSpec

Item = RequestSpec | Session


def split_slots(concurrency: int, workers: int) -> list[int]:
    """C slots over N workers: C // N each, one more for the first C % N."""
    if workers > concurrency:
        raise ValueError(f"{workers} workers cannot share {concurrency} slots: one at least each")
    base, extra = divmod(concurrency, workers)
    return [base + (i < extra) for i in range(workers)]


def assign(count: int, weights: Sequence[int]) -> list[int]:
    """The worker of each of `count` items, in proportion to `weights` and spread evenly
    (smooth weighted round robin, as nginx balances): equal weights give i mod N."""
    total = sum(weights)
    current = [0] * len(weights)
    owners = []
    for _ in range(count):
        for w, weight in enumerate(weights):
            current[w] += weight
        pick = max(range(len(weights)), key=current.__getitem__)  # the first of equals
        current[pick] -= total
        owners.append(pick)
    return owners


def fit_workers(cfg: Any) -> str | None:
    """Make `cfg.workers` fit its --concurrency (never more workers than slots); what to tell
    the user about the split, or None when there is nothing to say."""
    workers, cap = cfg.workers, cfg.concurrency
    if cap is None or not isinstance(workers, int) or (workers == 1 and not cfg.ray_address):
        return None
    said = []
    if workers > cap:
        said.append(f"--workers {workers} with --concurrency {cap}: {cap} workers, one slot each")
        cfg.workers = workers = cap
    slots = split_slots(cap, workers)
    if not cfg.closed_loop and workers > 1:
        said.append(
            f"the cap of {cap} in flight is split {'+'.join(map(str, slots))} over the workers: "
            "each queues its own arrivals for its own slots (one pool would lend a free slot "
            "to any arrival, so queue_s can be longer than one process's)"
        )
    return "; ".join(said) or None


class Dispenser:
    """A closed loop's requests on the driver, handed out in order: (index, record base,
    item), the index as one process numbers its sends and the record base the first record
    number of the item (a conversation's turns follow it)."""

    def __init__(self, specs: Iterator[Item], num_requests: int | None) -> None:
        self.specs, self.limit = specs, num_requests
        self.handed = 0
        self.records = 0
        self.exhausted = num_requests == 0

    def take(self, count: int) -> list[tuple[int, int, Item]]:
        out: list[tuple[int, int, Item]] = []
        while len(out) < count and not self.exhausted:
            item = next(self.specs, None)
            if item is None:
                self.exhausted = True
                break
            out.append((self.handed, self.records, item))
            self.handed += 1
            self.records += len(item.turns) if isinstance(item, Session) else 1
            if self.limit is not None and self.handed >= self.limit:
                self.exhausted = True
        return out


@dataclass(slots=True)
class Share:
    """One worker's part of the load: its items with their numbers in the whole run."""

    indices: list[int]  # each item's arrival index
    items: list[Item]
    offsets: list[float] | None  # an open loop's send offsets; None: a closed loop
    bases: list[int] | None  # the record number of each item's first request (multi-turn)


def open_shares(specs: Iterator[Item], offsets: list[float], weights: list[int]) -> list[Share]:
    """An open-loop schedule split by arrival index (in proportion to `weights`)."""
    items = list(specs)[: len(offsets)]  # as one process zips them
    bases, total = [], 0
    for item in items:  # multi-turn: records numbered by conversation, then turn
        bases.append(total)
        total += len(item.turns) if isinstance(item, Session) else 1
    multi_turn = any(isinstance(item, Session) for item in items)
    shares = [Share([], [], [], [] if multi_turn else None) for _ in weights]
    for i, owner in enumerate(assign(len(items), weights)):
        share = shares[owner]
        share.indices.append(i)
        share.items.append(items[i])
        share.offsets.append(offsets[i])  # type: ignore[union-attr]
        if share.bases is not None:
            share.bases.append(bases[i])
    return shares


def closed_shares(dispenser: Dispenser, weights: list[int]) -> list[Share]:
    """A closed loop's first requests, one for each of a worker's slots."""
    shares = [Share([], [], None, []) for _ in weights]
    first = dispenser.take(sum(weights))
    for (index, base, item), owner in zip(first, assign(len(first), weights), strict=True):
        shares[owner].indices.append(index)
        shares[owner].bases.append(base)  # type: ignore[union-attr]
        shares[owner].items.append(item)
    return shares
