"""Per-request block tables over a `BlockPool`: blocks are allocated as tokens arrive and
returned the moment a request finishes, is preempted or aborted."""

from __future__ import annotations

from engine.core.block_pool import BlockPool


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


class KVCacheManager:
    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.block_size = block_size
        self.pool = BlockPool(num_blocks)
        self.block_tables: dict[str, list[int]] = {}
        self.peak_blocks_used = 0
        self.peak_num_requests = 0

    @property
    def num_blocks(self) -> int:
        return self.pool.num_blocks

    @property
    def num_used_blocks(self) -> int:
        return self.pool.num_used

    def blocks_for(self, num_tokens: int) -> int:
        return cdiv(num_tokens, self.block_size)

    def allocate_slots(self, request_id: str, num_tokens: int) -> bool:
        """Make the request's table cover `num_tokens` tokens; False (and no change) if the
        pool is short."""
        table = self.block_tables.get(request_id, [])
        need = self.blocks_for(num_tokens) - len(table)
        if need > self.pool.num_free:
            return False
        if request_id not in self.block_tables:
            self.block_tables[request_id] = table
        if need > 0:
            table.extend(self.pool.allocate(need))
        self.peak_blocks_used = max(self.peak_blocks_used, self.pool.num_used)
        self.peak_num_requests = max(self.peak_num_requests, len(self.block_tables))
        return True

    def free(self, request_id: str) -> None:
        # Tail blocks first: they hold the least shareable tokens, so they are reused first.
        self.pool.free(reversed(self.block_tables.pop(request_id, [])))
