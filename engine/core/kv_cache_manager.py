"""Per-request block tables over a `BlockPool`: blocks are allocated as tokens arrive and
returned the moment a request finishes, is preempted or aborted; with prefix caching a new
request starts from the longest run of cached full blocks that match its tokens.

With a reservation (`reserve_tokens`, kv_reservation=max_len) a new table takes the blocks of
that many tokens at once, as a contiguous allocator would: the request's tokens then fill
blocks it already holds, and all of them return when it ends.

A block's hash covers its own tokens and, through its parent's hash, every token before it:
equal hashes mean equal keys and values in every layer (the model, dtype and scales are the
engine's, the same for every block)."""

from __future__ import annotations

import array
import itertools
from collections.abc import Callable
from hashlib import blake2b

from engine.core.block_pool import BlockHash, BlockPool


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def hash_block(parent: bytes | None, tokens: list[int]) -> bytes:
    """A 128-bit digest: a collision would silently serve another prompt's KV, so no 64-bit
    Python hash (vLLM moved to sha256 for the same reason; the simulation, which serves no
    KV, takes builtin_chain_hashes)."""
    return _digest(parent or b"", _token_bytes(tokens))


def _token_bytes(tokens: list[int]) -> bytes:
    return array.array("q", tokens).tobytes()  # int64, native order, as numpy's


def _digest(parent: bytes, token_bytes: bytes) -> bytes:
    h = blake2b(parent, digest_size=16)
    h.update(token_bytes)
    return h.digest()


def chain_hashes(parent: BlockHash | None, tokens: list[int], block_size: int) -> list[BlockHash]:
    """hash_block's of the full blocks of `tokens`, chained on `parent` (the tokens as bytes
    at once)."""
    data, width, out = _token_bytes(tokens), block_size * 8, []
    p = parent or b""
    for start in range(0, len(data), width):
        p = _digest(p, data[start : start + width])  # type: ignore[arg-type]
        out.append(p)
    return out


def builtin_chain_hashes(
    parent: BlockHash | None, tokens: list[int], block_size: int
) -> list[BlockHash]:
    """Python's 64-bit tuple hash of (parent, *tokens), chained: a third of chain_hashes'
    time, for the simulation alone, whose blocks hold no keys or values to serve by mistake
    (a collision, odds under 1e-5 among a simulated hour's 9 M blocks, would be one simulated
    cache hit). Ints hash alike in every process: runs repeat exactly."""
    out, p = [], parent or 0
    for start in range(0, len(tokens), block_size):
        p = hash((p, *tokens[start : start + block_size]))
        out.append(p)
    return out


BlockHasher = Callable[[BlockHash | None, list[int], int], list[BlockHash]]


class KVCacheManager:
    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        enable_prefix_caching: bool = True,
        reserve_tokens: int = 0,
        hasher: BlockHasher = chain_hashes,
    ) -> None:
        if reserve_tokens and enable_prefix_caching:
            raise ValueError("a max_len reservation cannot share blocks: no prefix caching")
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.reserve_tokens = reserve_tokens  # >0: what a new table reserves (max_len)
        self.hasher = hasher  # the prefix cache's block keys (chain_hashes, or the sim's)
        self.pool = BlockPool(num_blocks)
        self.block_tables: dict[str, list[int]] = {}
        self.peak_blocks_used = 0
        self.peak_blocks_shared = 0  # most block copies sharing saved at once
        self.peak_num_requests = 0
        self._hashes: dict[str, list[BlockHash]] = {}  # each request's full blocks, in order
        self._num_cached: dict[str, int] = {}  # how many of its blocks are in the cache
        self.prefix_queries = 0  # tokens looked up (vLLM's prefix_cache_queries)
        self.prefix_hits = 0  # of those, tokens found cached

    @property
    def num_blocks(self) -> int:
        return self.pool.num_blocks

    @property
    def prefix_hit_rate(self) -> float:
        """Prompt tokens found in the prefix cache / prompt tokens looked up (vLLM's)."""
        return self.prefix_hits / self.prefix_queries if self.prefix_queries else 0.0

    @property
    def num_used_blocks(self) -> int:
        return self.pool.num_used

    def blocks_for(self, num_tokens: int) -> int:
        return cdiv(num_tokens, self.block_size)

    # ---- prefix cache ------------------------------------------------------------------

    def block_hashes(
        self, request_id: str, token_ids: list[int], num_blocks: int
    ) -> list[BlockHash]:
        """The chained hashes of the request's full blocks, at least its first `num_blocks`:
        the request's own list, kept and extended as its tokens grow (callers index it; a
        simulated hour hashes ~9 M blocks, most one at a time as decodes fill them)."""
        hashes = self._hashes.get(request_id)
        if hashes is None:
            hashes = self._hashes[request_id] = []
        done = len(hashes)
        if done < num_blocks:
            bs = self.block_size
            tokens = token_ids[done * bs : num_blocks * bs]
            hashes += self.hasher(hashes[-1] if hashes else None, tokens, bs)
        return hashes

    def computed_blocks(self, request_id: str, token_ids: list[int]) -> list[int]:
        """The longest run of cached blocks matching the tokens' full blocks from the start;
        never the whole sequence: its last token is computed again for its logits."""
        if not self.enable_prefix_caching:
            return []
        hit: list[int] = []
        full = (len(token_ids) - 1) // self.block_size
        lookup = self.pool.cached.get
        for h in itertools.islice(self.block_hashes(request_id, token_ids, full), full):
            block = lookup(h)
            if block is None:
                break
            hit.append(block)
        return hit

    def record_lookup(self, num_tokens: int, num_hit_tokens: int) -> None:
        """Counted once per admitted request (not per attempt that found no room)."""
        if self.enable_prefix_caching:
            self.prefix_queries += num_tokens
            self.prefix_hits += num_hit_tokens

    def cache_computed(self, request_id: str, token_ids: list[int], num_computed: int) -> None:
        """Make the request's full blocks whose tokens are all computed findable."""
        if not self.enable_prefix_caching or request_id not in self.block_tables:
            return
        full = num_computed // self.block_size
        done = self._num_cached.get(request_id, 0)
        if full <= done:
            return
        table = self.block_tables[request_id]
        hashes, cache = self.block_hashes(request_id, token_ids, full), self.pool.cache
        for i in range(done, full):
            cache(table[i], hashes[i])
        self._num_cached[request_id] = full

    def reset_prefix_cache(self) -> int:
        return self.pool.reset_cache()

    # ---- allocation --------------------------------------------------------------------

    def allocate_slots(
        self, request_id: str, num_tokens: int, computed: list[int] | None = None
    ) -> bool:
        """Make the request's table cover `num_tokens` tokens, starting a new table with the
        cache-hit blocks `computed`; False (and no change) if the pool is short."""
        table = self.block_tables.get(request_id)
        if table is not None and -(-num_tokens // self.block_size) <= len(table):
            return True  # covered already (most calls: a decode inside its last block)
        computed = computed or []
        assert not (computed and table), "cache hits start a table"
        if table is None:  # max_len: the whole reservation now, never a block later
            num_tokens = max(num_tokens, self.reserve_tokens)
        have = len(table) if table is not None else len(computed)
        need = max(0, self.blocks_for(num_tokens) - have)
        reclaimed = sum(self.pool.is_free(b) for b in computed)  # hits now in the free queue
        if need + reclaimed > self.pool.num_free:
            return False
        if table is None:
            table = self.block_tables[request_id] = []
            if computed:
                self.pool.touch(computed)
                table.extend(computed)
                self._num_cached[request_id] = len(computed)
        if need > 0:
            table.extend(self.pool.allocate(need))
        self.peak_blocks_used = max(self.peak_blocks_used, self.pool.num_used)
        self.peak_blocks_shared = max(self.peak_blocks_shared, self.pool.num_shared_refs)
        self.peak_num_requests = max(self.peak_num_requests, len(self.block_tables))
        return True

    def grow(self, request_ids: list[str]) -> None:
        """One more block for each of these tables, in order: what allocate_slots does for
        decodes that cross into a new block, in one call (the simulation's many a step).
        The caller knows the pool has them."""
        for rid, block in zip(request_ids, self.pool.allocate(len(request_ids)), strict=True):
            self.block_tables[rid].append(block)
        self.peak_blocks_used = max(self.peak_blocks_used, self.pool.num_used)

    def trim(self, request_id: str, num_tokens: int) -> None:
        """Give back the blocks past the first `num_tokens` tokens (rejected draft tokens'),
        never below a max_len reservation."""
        table = self.block_tables[request_id]
        keep = self.blocks_for(max(num_tokens, self.reserve_tokens))
        if len(table) > keep:
            self.pool.free(reversed(table[keep:]))
            del table[keep:]

    def free(self, request_id: str) -> None:
        # Tail blocks first: they hold the least shareable tokens, so they are reused first.
        self.pool.free(reversed(self.block_tables.pop(request_id, [])))
        self._hashes.pop(request_id, None)
        self._num_cached.pop(request_id, None)
