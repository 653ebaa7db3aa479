"""The engine's CPU prefill attention (ops/cpu_prefill_attention.cpp) computes causal
attention over the paged cache as a plain float64 formula does, for chunks that start at 0 or
after cached tokens, any GQA group and head size the engine serves, and steps that mix decodes
with prefill chunks; bad tables are refused, not read."""

import numpy as np
import pytest
import torch

from engine.ops import AttentionMetadata, KVCache, attention, cpu_kernels, paged_attention

pytestmark = pytest.mark.skipif(
    not cpu_kernels.available(), reason="the engine's CPU kernels could not be built here"
)


def step_case(
    starts: list[int],
    q_lens: list[int],
    heads: int,
    kv_heads: int,
    head_dim: int,
    dtype: torch.dtype,
    block_size: int = 16,
) -> tuple[torch.Tensor, KVCache, AttentionMetadata]:
    """A step over a shuffled pool: every request's blocks are scattered, tables padded."""
    gen = torch.Generator().manual_seed(len(starts) * 100 + heads + head_dim)
    s, ql = np.array(starts), np.array(q_lens)
    need = -(-(s + ql) // block_size)
    pool = int(need.sum()) + 7
    order = torch.randperm(pool, generator=gen).numpy()
    tables = np.zeros((len(s), need.max() + 2), dtype=np.int64)
    used = 0
    for i, n in enumerate(need):
        tables[i, :n] = order[used : used + n]
        used += n
    k = torch.randn(kv_heads, pool, block_size, head_dim, generator=gen).to(dtype)
    v = torch.randn(kv_heads, pool, block_size, head_dim, generator=gen).to(dtype)
    q = torch.randn(int(ql.sum()), heads, head_dim, generator=gen).to(dtype)
    meta = AttentionMetadata.build(s, ql, tables, block_size, torch.device("cpu"))
    return q, KVCache(k, v), meta


def reference(q: torch.Tensor, cache: KVCache, meta: AttentionMetadata) -> torch.Tensor:
    """softmax(q k^T / sqrt(d), causal) v per request, in float64 from K/V gathered by hand."""
    heads, head_dim = q.shape[1:]
    kv_heads, _, bs, _ = cache.k.shape
    out = torch.empty(q.shape, dtype=torch.float64)
    bounds = meta.query_start.tolist()
    for i, seq_len in enumerate(meta.seq_lens.tolist()):
        first, last = bounds[i], bounds[i + 1]
        keys = torch.arange(seq_len)
        blocks = meta.block_tables[i].long()[keys // bs]
        k = cache.k[:, blocks, keys % bs].double()  # [kv_heads, seq_len, head_dim]
        v = cache.v[:, blocks, keys % bs].double()
        k, v = k.repeat_interleave(heads // kv_heads, 0), v.repeat_interleave(heads // kv_heads, 0)
        qi = q[first:last].double().transpose(0, 1)  # [heads, n, head_dim]
        scores = qi @ k.transpose(1, 2) / head_dim**0.5
        pos = torch.arange(seq_len - (last - first), seq_len)
        scores.masked_fill_(keys[None, None, :] > pos[None, :, None], float("-inf"))
        out[first:last] = (scores.softmax(-1) @ v).transpose(0, 1)
    return out


def prefill_kernel(q: torch.Tensor, cache: KVCache, meta: AttentionMetadata) -> torch.Tensor:
    return torch.ops.servebench.prefill_attention(
        q, cache.k, cache.v, meta.block_tables, meta.seq_lens, meta.query_start,
        q.shape[-1] ** -0.5,
    )  # fmt: skip


CHUNKS = [
    ([0], [2]),  # two tokens: the smallest prefill
    ([0, 0], [5, 37]),  # from the start, under and over a 16-token task
    ([17, 0, 100], [3, 128, 40]),  # after cached tokens (chunked prefill, prefix hits)
    ([0, 0, 0], [200, 16, 17]),  # many blocks, block-aligned and one past
]


@pytest.mark.parametrize(("starts", "q_lens"), CHUNKS)
@pytest.mark.parametrize(("heads", "kv_heads", "head_dim"), [(9, 3, 64), (4, 4, 64), (8, 2, 128)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_prefill_kernel_matches_the_formula(
    starts: list[int], q_lens: list[int], heads: int, kv_heads: int, head_dim: int,
    dtype: torch.dtype,
) -> None:  # fmt: skip
    q, cache, meta = step_case(starts, q_lens, heads, kv_heads, head_dim, dtype)
    got = prefill_kernel(q, cache, meta)
    assert got.dtype == dtype and got.shape == q.shape
    # float32 agrees to rounding; bf16 differs by the output's own rounding (8 bits).
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(got.double(), reference(q, cache, meta), rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_step_of_decodes_and_chunks_attends_as_the_torch_path(
    dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Three decodes (q_len 1) first, then two prefill chunks, one after cached tokens.
    q, cache, meta = step_case([40, 3, 70, 0, 33], [1, 1, 1, 60, 21], 9, 3, 64, dtype)
    with torch.inference_mode():
        got = paged_attention(q, cache, meta, 0.125)
        monkeypatch.setattr(attention, "kernel_fits", lambda *_: False)
        want = paged_attention(q, cache, meta, 0.125)
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(got.float(), want.float(), rtol=tol, atol=tol)


def test_bad_tables_and_offsets_are_refused() -> None:
    q, cache, meta = step_case([0, 5], [20, 30], 9, 3, 64, torch.float32)
    pool = cache.k.shape[1]
    bad = meta.block_tables.clone()
    bad[1, 1] = pool  # one past the pool, inside the context
    with pytest.raises(RuntimeError, match=f"block {pool} of {pool}"):
        torch.ops.servebench.prefill_attention(
            q, cache.k, cache.v, bad, meta.seq_lens, meta.query_start, 0.125
        )
    with pytest.raises(RuntimeError, match="query_start"):
        torch.ops.servebench.prefill_attention(
            q, cache.k, cache.v, meta.block_tables, meta.seq_lens, meta.query_start + 1, 0.125
        )
    longer = meta.seq_lens.clone()
    longer[0] = meta.block_tables.shape[1] * 16 + 1  # more keys than its table holds
    with pytest.raises(RuntimeError, match="keys in"):
        torch.ops.servebench.prefill_attention(
            q, cache.k, cache.v, meta.block_tables, longer, meta.query_start, 0.125
        )
