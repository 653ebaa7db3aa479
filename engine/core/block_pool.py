"""A fixed pool of KV-cache blocks with reference counts, and the prefix cache over it.

Free blocks wait in a queue in the order they were freed; allocation takes the least recently
freed first. Blocks never used yet stand at the front of that queue, in order, as a counter
rather than entries: a simulated H100 holds ~17 M blocks of a tiny model, whose queue alone
took 2.6 s and over a GB to build.

A full block that was computed carries the hash of its tokens (chained on its parent's), and
a freed block keeps that hash: it stays findable, and reusable by a later request with the
same prefix, until allocation hands it out for other tokens (vLLM v1's design: eviction is
simply LRU reuse of the free queue)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable

BlockHash = bytes | int  # blake2b's 128-bit digest; the simulation's 64-bit tuple hash


class NoFreeBlocksError(RuntimeError):
    pass


class BlockPool:
    def __init__(self, num_blocks: int) -> None:
        if num_blocks < 1:
            raise ValueError(f"a block pool needs at least one block, got {num_blocks}")
        self.num_blocks = num_blocks
        self.ref_counts = [0] * num_blocks
        self.block_hash: list[BlockHash | None] = [None] * num_blocks
        self.cached: dict[BlockHash, int] = {}  # hash -> the block holding those tokens
        self._fresh = 0  # blocks from here on were never used: the front of the free queue
        self._freed: OrderedDict[int, None] = OrderedDict()  # behind them, oldest first
        self.num_evicted = 0  # cached blocks handed out for other tokens
        # Uses beyond the first, summed over blocks: the blocks that requests not sharing
        # would each hold a copy of (parallel-sampling siblings, prefix-cache hits).
        self.num_shared_refs = 0

    @property
    def num_free(self) -> int:
        """Blocks with no user: never used, or freed (cached ones among them stay findable)."""
        return self.num_blocks - self._fresh + len(self._freed)

    @property
    def num_used(self) -> int:
        return self._fresh - len(self._freed)

    def free_queue(self) -> list[int]:
        """The free blocks in the order allocation takes them (tests)."""
        return [*range(self._fresh, self.num_blocks), *self._freed]

    def allocate(self, n: int) -> list[int]:
        """n blocks for new tokens, least recently freed first; a cached one loses its hash."""
        if n > self.num_free:
            raise NoFreeBlocksError(f"asked for {n} blocks, {self.num_free} free")
        fresh = min(n, self.num_blocks - self._fresh)
        blocks = list(range(self._fresh, self._fresh + fresh))
        self._fresh += fresh
        pop, block_hash, ref_counts = self._freed.popitem, self.block_hash, self.ref_counts
        blocks += [pop(last=False)[0] for _ in range(n - fresh)]
        for b in blocks:  # a cached one loses its hash (a simulated hour allocates ~9 M)
            h = block_hash[b]
            if h is not None:
                del self.cached[h]
                block_hash[b] = None
                self.num_evicted += 1
            ref_counts[b] = 1
        return blocks

    def touch(self, blocks: Iterable[int]) -> None:
        """One more user of each block (a cache hit): a free one leaves the free queue."""
        for b in blocks:
            if self.ref_counts[b] == 0:
                if b >= self._fresh:
                    raise RuntimeError(f"block {b} touched before it was ever used")
                del self._freed[b]
            else:
                self.num_shared_refs += 1
            self.ref_counts[b] += 1

    def free(self, blocks: Iterable[int]) -> None:
        """One user fewer; a block nobody uses goes to the back of the free queue, hash kept."""
        ref_counts, free = self.ref_counts, self._freed
        for b in blocks:
            refs = ref_counts[b]
            if refs == 1:  # the common case: its only user
                ref_counts[b] = 0
                free[b] = None
            elif refs <= 0:
                raise RuntimeError(f"block {b} freed while not in use")
            else:
                self.num_shared_refs -= 1
                ref_counts[b] = refs - 1

    def cache(self, block: int, block_hash: BlockHash) -> None:
        """Make a computed full block findable by its hash. When another block already holds
        the same tokens (two requests computed them at once), the first one stays the cached
        copy and this one is reused as an ordinary block once freed."""
        if self.block_hash[block] is not None or block_hash in self.cached:
            return
        self.block_hash[block] = block_hash
        self.cached[block_hash] = block

    def is_free(self, block: int) -> bool:
        return self.ref_counts[block] == 0

    def reset_cache(self) -> int:
        """Forget every cached hash of a free block (vLLM's reset_prefix_cache); blocks in use
        keep theirs. Returns how many were forgotten."""
        dropped = [b for b in self._freed if self.block_hash[b] is not None]  # used ones only
        for b in dropped:
            del self.cached[self.block_hash[b]]  # type: ignore[arg-type]
            self.block_hash[b] = None
        return len(dropped)
