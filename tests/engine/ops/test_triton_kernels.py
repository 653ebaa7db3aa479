"""The Triton kernels (engine/ops/triton) against the torch reference ops of the same
signature, on small random shapes. Without CUDA they run in Triton's interpreter, whose
known bugs the kernels work around (ops/triton/cast.py): float32 -> bf16 and -> e4m3 casts
are rounded by hand there, and tl.dot multiplies bf16 inputs in float32. The fp8 and bf16
cases below are what checks those workarounds."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from engine import ops  # before triton: it sets the interpreter up without CUDA
from engine.ops import AttentionMetadata, KVCache
from engine.ops.fp8 import FP8

pytest.importorskip("triton")
from engine.ops import triton as tops

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def step_case(
    seqs: list[tuple[int, int]],  # (cached tokens, tokens this step): decodes (1) first
    group: int,
    kv_heads: int = 2,
    head_dim: int = 32,
    block_size: int = 16,
    dtype: torch.dtype = torch.float32,
    cache_dtype: torch.dtype | None = None,
    seed: int = 0,
) -> tuple[torch.Tensor, KVCache, AttentionMetadata]:
    """Queries and a filled cache for one step over a pool with holes (unused blocks between
    the ones in use, in shuffled order), where the second sequence shares the first's first
    block, as a prefix-cache hit does."""
    gen = torch.Generator().manual_seed(seed)
    starts = np.array([s for s, _ in seqs], dtype=np.int64)
    q_lens = np.array([n for _, n in seqs], dtype=np.int64)
    nb = int(-(-(starts + q_lens).max() // block_size))
    pool = 2 * len(seqs) * nb + 3
    tables = torch.randperm(pool, generator=gen)[: len(seqs) * nb].view(len(seqs), nb).numpy()
    if len(seqs) > 1 and min(starts[:2]) >= block_size:
        tables[1, 0] = tables[0, 0]
    shape = (kv_heads, pool, block_size, head_dim)
    cache_dtype = cache_dtype or dtype
    if cache_dtype == FP8:
        scales = [torch.rand(kv_heads, 1, 1, generator=gen) * 0.02 + 0.005 for _ in "kv"]
        k, v = (
            torch.randn(shape, generator=gen).div(s[..., None]).clamp(-448, 448).to(FP8)
            for s in scales
        )
        cache = KVCache(k, v, *scales)
    else:
        cache = KVCache(*(torch.randn(shape, generator=gen).to(cache_dtype) for _ in "kv"))
    q = torch.randn(int(q_lens.sum()), kv_heads * group, head_dim, generator=gen).to(dtype)
    meta = AttentionMetadata.build(starts, q_lens, tables, block_size, torch.device("cpu"))
    return q, cache, meta


def on_device(*tensors: torch.Tensor | None) -> list[torch.Tensor | None]:
    return [None if t is None else t.to(DEVICE) for t in tensors]


def run_attention(
    q: torch.Tensor, cache: KVCache, meta: AttentionMetadata, scale: float, tile: int | None,
    segments: int | None = None,
) -> torch.Tensor:  # fmt: skip
    """The kernel, on the GPU where there is one (metadata and cache copied there)."""
    fields = {f: getattr(meta, f) for f in AttentionMetadata.__slots__}
    fields = {f: v.to(DEVICE) if isinstance(v, torch.Tensor) else v for f, v in fields.items()}
    cache = KVCache(*on_device(cache.k, cache.v, cache.k_scale, cache.v_scale))
    meta = AttentionMetadata(**fields)
    return tops.paged_attention(q.to(DEVICE), cache, meta, scale, tile, segments)


CASES = {
    "decode only": [(40, 1), (17, 1), (0, 1), (63, 1)],
    "prefill only": [(0, 20), (0, 33)],
    "mixed, chunk mid-block": [(30, 1), (18, 1), (0, 19), (21, 12), (5, 40)],
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("group", [1, 3])
def test_attention_matches_the_reference(case: str, group: int) -> None:
    q, cache, meta = step_case(CASES[case], group)
    want = ops.paged_attention(q, cache, meta, 32**-0.5)
    got = run_attention(q, cache, meta, 32**-0.5, None)
    torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    ("dtype", "cache_dtype", "block_size", "tile", "tol"),
    [
        (torch.float32, torch.float32, 16, 32, 1e-5),  # a tile spans two blocks
        (torch.float32, torch.float32, 32, 16, 1e-5),  # two tiles per block
        (torch.float32, torch.bfloat16, 16, 16, 1e-5),  # bf16 storage under a float32 model
        (torch.bfloat16, torch.bfloat16, 16, 16, 2e-2),
        (torch.float32, FP8, 16, 16, 1e-5),
        (torch.bfloat16, FP8, 16, 16, 2e-2),
    ],
)
def test_attention_dtypes_block_sizes_and_tiles(
    dtype: torch.dtype, cache_dtype: torch.dtype, block_size: int, tile: int, tol: float
) -> None:
    seqs = [(45, 1), (33, 1), (0, 7), (36, 29)]
    q, cache, meta = step_case(seqs, 3, block_size=block_size, dtype=dtype, cache_dtype=cache_dtype)
    want = ops.paged_attention(q, cache, meta, 32**-0.5)
    got = run_attention(q, cache, meta, 32**-0.5, tile)
    torch.testing.assert_close(got.cpu(), want, rtol=tol, atol=tol)


@pytest.mark.parametrize(
    ("seqs", "cache_dtype"),
    [(CASES["decode only"], torch.float32), (CASES["decode only"], FP8),
     ([(30, 1), (0, 9), (21, 12)], FP8)],
)  # fmt: skip
def test_attention_over_key_slices_merged_after(
    seqs: list[tuple[int, int]], cache_dtype: torch.dtype
) -> None:
    """The split-key variant a GPU takes for decode steps of few sequences (4 slices here; a
    mixed step too, where some slices hold only keys after a prefill query)."""
    q, cache, meta = step_case(seqs, 3, cache_dtype=cache_dtype)
    want = ops.paged_attention(q, cache, meta, 32**-0.5)
    got = run_attention(q, cache, meta, 32**-0.5, 16, segments=4)
    torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    ("dtype", "cache_dtype"),
    [(torch.float32, torch.float32), (torch.float32, torch.bfloat16), (torch.bfloat16, FP8)],
)
def test_kv_cache_write_matches_the_reference(dtype: torch.dtype, cache_dtype: torch.dtype) -> None:
    """K and V as views of one QKV output (strided rows), written through shuffled slots; fp8
    quantized with per-head scales in the kernel: bit-identical caches."""
    _, cache, meta = step_case([(20, 1), (0, 18), (3, 9)], 1, dtype=dtype, cache_dtype=cache_dtype)
    gen = torch.Generator().manual_seed(1)
    tokens, kv, head_dim = len(meta.slot_mapping), cache.k.shape[0], cache.k.shape[-1]
    qkv = (torch.randn(tokens, 4 * kv * head_dim, generator=gen) * 4).to(dtype)
    k = qkv[:, kv * head_dim : 2 * kv * head_dim].view(tokens, kv, head_dim)
    v = qkv[:, 2 * kv * head_dim : 3 * kv * head_dim].view(tokens, kv, head_dim)
    want = KVCache(cache.k.clone(), cache.v.clone(), cache.k_scale, cache.v_scale)
    ops.write_kv_cache(k, v, want, meta.slot_mapping)
    got = KVCache(*on_device(cache.k, cache.v, cache.k_scale, cache.v_scale))
    k2, v2, slots = on_device(k, v, meta.slot_mapping)
    tops.write_kv_cache(k2, v2, got, slots)
    for g, w in ((got.k, want.k), (got.v, want.v)):
        assert torch.equal(g.cpu().view(torch.uint8), w.view(torch.uint8))


def test_fp8_rounding_matches_torch_everywhere() -> None:
    """Values near every power of two, where the interpreter's own cast is wrong, and ties."""
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(FP8).float()
    grid = codes[codes.isfinite()].unique()
    mids = (grid[1:] + grid[:-1]) / 2  # ties: round to even
    x = torch.cat([grid, mids, mids.nextafter(grid[1:]), mids.nextafter(grid[:-1])])
    x = x[x.abs() <= 448].view(-1, 1, 1).expand(-1, 1, 16).contiguous()
    one = torch.ones(1, 1, 1)
    cache = KVCache(*(torch.zeros(1, len(x), 1, 16, dtype=FP8) for _ in "kv"), one, one)
    want = KVCache(cache.k.clone(), cache.v.clone(), one, one)
    slots = torch.arange(len(x))
    ops.write_kv_cache(x, x, want, slots)
    got = KVCache(*on_device(cache.k, cache.v, one, one))
    tops.write_kv_cache(*on_device(x, x), got, *on_device(slots))
    assert torch.equal(got.k.cpu().view(torch.uint8), want.k.view(torch.uint8))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("rows", "hidden"), [(1, 64), (37, 96)])
def test_rms_norm_and_add_rms_norm(dtype: torch.dtype, rows: int, hidden: int) -> None:
    gen = torch.Generator().manual_seed(2)
    x, r = (torch.randn(rows, hidden, generator=gen).to(dtype) for _ in "xr")
    w = (1 + 0.1 * torch.randn(hidden, generator=gen)).to(dtype)
    tol = {"rtol": 1e-5, "atol": 1e-5} if dtype == torch.float32 else {}
    x2, r2, w2 = on_device(x, r, w)
    torch.testing.assert_close(tops.rms_norm(x2, w2, 1e-5).cpu(), ops.rms_norm(x, w, 1e-5), **tol)
    got, got_sum = tops.add_rms_norm(x2, r2, w2, 1e-5)
    want, want_sum = ops.add_rms_norm(x, r, w, 1e-5)
    assert torch.equal(got_sum.cpu(), want_sum)  # the add rounds as torch's does
    torch.testing.assert_close(got.cpu(), want, **tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rotary_in_place_on_qkv_views(dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(3)
    tokens, heads, kv, head_dim = 11, 6, 2, 32
    qkv = torch.randn(tokens, (heads + 2 * kv) * head_dim, generator=gen).to(dtype)
    positions = torch.randint(0, 500, (tokens,), generator=gen)
    cos_sin = ops.rotary_cos_sin(head_dim, 512, 10000.0, dtype, torch.device("cpu"))[positions]
    q = qkv[:, : heads * head_dim].view(tokens, heads, head_dim)
    k = qkv[:, heads * head_dim : (heads + kv) * head_dim].view(tokens, kv, head_dim)
    want_q, want_k = ops.rotary_qk(q, k, cos_sin)
    tol = {"rtol": 1e-6, "atol": 1e-6} if dtype == torch.float32 else {"rtol": 0, "atol": 0}
    torch.testing.assert_close(tops.apply_rotary(*on_device(q, cos_sin)).cpu(), want_q, **tol)
    qkv2, cs2 = on_device(qkv, cos_sin)
    q2 = qkv2[:, : heads * head_dim].view(tokens, heads, head_dim)
    k2 = qkv2[:, heads * head_dim : (heads + kv) * head_dim].view(tokens, kv, head_dim)
    got_q, got_k = tops.rotary_qk(q2, k2, cs2)
    torch.testing.assert_close(got_q.cpu(), want_q, **tol)
    torch.testing.assert_close(got_k.cpu(), want_k, **tol)
    # V, the part of the QKV output after K, is left alone
    assert torch.equal(qkv2[:, (heads + kv) * head_dim :].cpu(), qkv[:, (heads + kv) * head_dim :])


def test_the_gpu_launch_sizes_in_the_interpreter(monkeypatch: pytest.MonkeyPatch) -> None:
    """The kernels at the block sizes a GPU launches them with (the interpreter takes bigger
    ones for speed): 16 query rows and 32 keys a program, 1 to 16 rows a norm, rotary or
    cache-write program."""
    from engine.ops.triton import attention, kv_cache, norm, rotary

    for module, name, value in (
        (attention, "MIN_BLOCK_M", 16),
        (attention, "TILE", 32),
        (kv_cache, "ROWS", 8),
        (norm, "ROWS", 1),
        (rotary, "ROWS", 16),
    ):
        monkeypatch.setattr(module, name, value)  # fmt: skip
    for group in (1, 3):
        q, cache, meta = step_case(CASES["mixed, chunk mid-block"], group, dtype=torch.bfloat16)
        want = ops.paged_attention(q, cache, meta, 32**-0.5)
        got = run_attention(q, cache, meta, 32**-0.5, None)
        torch.testing.assert_close(got.cpu(), want, rtol=2e-2, atol=2e-2)
    test_kv_cache_write_matches_the_reference(torch.bfloat16, FP8)
    test_rms_norm_and_add_rms_norm(torch.bfloat16, 5, 96)
    test_rotary_in_place_on_qkv_views(torch.bfloat16)
