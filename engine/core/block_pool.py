"""A fixed pool of KV-cache blocks with reference counts.

Blocks are handed out from the front of a free queue and returned to its back, so the
least recently freed block is reused first (the order prefix caching will rely on)."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable


class NoFreeBlocksError(RuntimeError):
    pass


class BlockPool:
    def __init__(self, num_blocks: int) -> None:
        if num_blocks < 1:
            raise ValueError(f"a block pool needs at least one block, got {num_blocks}")
        self.num_blocks = num_blocks
        self.ref_counts = [0] * num_blocks
        self._free: deque[int] = deque(range(num_blocks))

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return self.num_blocks - len(self._free)

    def allocate(self, n: int) -> list[int]:
        if n > len(self._free):
            raise NoFreeBlocksError(f"asked for {n} blocks, {len(self._free)} free")
        blocks = [self._free.popleft() for _ in range(n)]
        for b in blocks:
            self.ref_counts[b] = 1
        return blocks

    def free(self, blocks: Iterable[int]) -> None:
        for b in blocks:
            if self.ref_counts[b] <= 0:
                raise RuntimeError(f"block {b} freed while not in use")
            self.ref_counts[b] -= 1
            if self.ref_counts[b] == 0:
                self._free.append(b)
