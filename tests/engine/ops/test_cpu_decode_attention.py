"""The compiled CPU decode attention computes what the eager gather-then-matmul path does,
and the engine uses it by default and falls back to eager when it cannot compile."""

from dataclasses import replace

import numpy as np
import pytest
import torch

from engine import LLM, SamplingParams
from engine.model import sources
from engine.ops import (
    AttentionMetadata,
    KVCache,
    attention,
    cpu_decode_attention,
    cpu_kernels,
    paged_attention,
)
from engine.ops.fp8 import dequantize, quantize


def decode_case(
    batch: int, max_len: int, cache_dtype: torch.dtype, seed: int = 0
) -> tuple[torch.Tensor, KVCache, AttentionMetadata]:
    """A decode batch over a shuffled pool: every sequence's blocks are scattered."""
    gen = torch.Generator().manual_seed(seed)
    kv_heads, group, bs, head_dim = 3, 3, 16, 64
    nb = -(-max_len // bs)
    lens = torch.randint(bs + 1, max_len + 1, (batch,), generator=gen)
    lens[0] = max_len
    pool = batch * nb + 5
    k = torch.randn(kv_heads, pool, bs, head_dim, generator=gen).to(cache_dtype)
    v = torch.randn(kv_heads, pool, bs, head_dim, generator=gen).to(cache_dtype)
    tables = torch.randperm(pool, generator=gen)[: batch * nb].view(batch, nb)
    q = torch.randn(batch, kv_heads * group, head_dim, generator=gen)
    ones = np.ones(batch, dtype=np.int64)
    meta = AttentionMetadata.build(lens.numpy() - 1, ones, tables.numpy(), bs, torch.device("cpu"))
    return q, KVCache(k, v), meta


@pytest.mark.parametrize(
    ("batch", "max_len", "cache_dtype"),
    [
        (2, 17, torch.float32),
        (5, 100, torch.float32),
        (33, 300, torch.float32),
        (7, 64, torch.bfloat16),
    ],
)
def test_compiled_decode_attention_matches_the_eager_path(
    batch: int, max_len: int, cache_dtype: torch.dtype
) -> None:
    q, cache, meta = decode_case(batch, max_len, cache_dtype)
    assert cpu_decode_attention.warm_up(cache.k, 3, torch.float32, 64**-0.5)
    with torch.inference_mode():
        want = paged_attention(q, cache, meta, 64**-0.5)
        meta.decode_fused = True
        got = paged_attention(q, cache, meta, 64**-0.5)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    # Keys past a sequence's length do not count: garbage there changes nothing.
    cache.k[:, meta.decode_block_tables[1:, -1]] = 1e4
    with torch.inference_mode():
        again = paged_attention(q, cache, meta, 64**-0.5)
    short = meta.decode_mask[:, 0, 0, -16:].any(-1).logical_not()
    short[0] = True  # sequence 0's last block is full and was not touched
    torch.testing.assert_close(again[short], got[short], rtol=1e-5, atol=1e-5)


def test_engine_compiles_decode_attention_by_default_with_the_same_greedy_tokens() -> None:
    prompts = [[(7 * i + j) % 200 + 3 for j in range(5 + 9 * i)] for i in range(6)]
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    outputs = {}
    for eager in (False, True):
        llm = LLM("tiny-llama", enforce_eager=eager, max_num_seqs=6, seed=3)
        assert llm.llm_engine.runner.fused_decode is not eager
        outputs[eager] = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
    assert outputs[False] == outputs[True]


def test_a_machine_that_cannot_compile_stays_eager(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken() -> object:
        raise RuntimeError("no C++ compiler")

    monkeypatch.setattr(cpu_decode_attention, "_compiled", broken)
    monkeypatch.setitem(cpu_decode_attention._state, "enabled", True)
    monkeypatch.setattr(cpu_decode_attention, "_compiled_shapes", set())
    llm = LLM("tiny-llama", max_num_seqs=4)
    assert not llm.llm_engine.runner.fused_decode
    assert not cpu_decode_attention.usable(4, 4)
    out = llm.generate([[5, 6, 7]] * 3, SamplingParams(max_tokens=20, ignore_eos=True))
    assert [len(o.outputs[0].token_ids) for o in out] == [20] * 3


def test_a_bfloat16_engine_starts_on_the_compiled_path_and_generates() -> None:
    llm = LLM("tiny-llama", dtype="bfloat16", max_num_seqs=4, seed=3)
    assert llm.llm_engine.decode_attention == "compiled"
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    out = llm.generate([[5, 6, 7], list(range(3, 40)), [9] * 20], params)
    assert [len(o.outputs[0].token_ids) for o in out] == [12] * 3


def test_bfloat16_compiled_decode_attention_is_within_bf16_rounding_of_float32() -> None:
    q, cache, meta = decode_case(6, 80, torch.bfloat16, seed=1)
    assert cpu_decode_attention.warm_up(cache.k, 3, torch.bfloat16, 64**-0.5)
    with torch.inference_mode():
        want = paged_attention(q, cache, meta, 64**-0.5)  # float32 queries: the oracle
        meta.decode_fused = True
        got = paged_attention(q.bfloat16(), cache, meta, 64**-0.5)
    assert got.dtype == torch.bfloat16
    tol = cpu_decode_attention.check_tolerance(torch.bfloat16)
    torch.testing.assert_close(got.float(), want, rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("fault", ["drops the mask", "wrong scale"])
def test_warm_up_refuses_a_wrong_kernel(
    monkeypatch: pytest.MonkeyPatch, dtype: torch.dtype, fault: str
) -> None:
    def wrong(q, k_cache, v_cache, block_tables, mask, scale):  # type: ignore[no-untyped-def]
        if fault == "drops the mask":
            mask = torch.ones_like(mask)
        else:
            scale = 1.0
        return cpu_decode_attention.decode_attention(q, k_cache, v_cache, block_tables, mask, scale)

    monkeypatch.setattr(cpu_decode_attention, "_compiled", lambda: wrong)
    monkeypatch.setitem(cpu_decode_attention._state, "enabled", True)
    k_cache = torch.zeros(3, 8, 16, 64, dtype=dtype)
    with pytest.raises(RuntimeError, match="disagrees with its float32 formula"):
        cpu_decode_attention.warm_up(k_cache, 3, dtype, 64**-0.5)


@pytest.mark.parametrize(
    ("batch", "max_len", "head_dim", "group"),
    [(1, 1, 64, 3), (2, 17, 64, 3), (5, 100, 64, 1), (9, 300, 128, 4)],
)
def test_the_engines_kernel_computes_the_formula(
    batch: int, max_len: int, head_dim: int, group: int
) -> None:
    """ops/cpu_kernels.cpp's decode attention against `decode_attention` in float32: scattered
    blocks, partial last blocks, and table padding past each context that must not be read."""
    assert cpu_kernels.available()
    gen = torch.Generator().manual_seed(batch)
    kv_heads, bs = 2, 16
    nb = -(-max_len // bs)
    pool = batch * nb + 3
    k, v = (torch.randn(kv_heads, pool, bs, head_dim, generator=gen) for _ in "kv")
    tables = torch.randperm(pool, generator=gen)[: batch * nb].view(batch, nb)
    lens = torch.randint(1, max_len + 1, (batch,), generator=gen)
    lens[0] = max_len
    mask = torch.arange(nb * bs)[None] < lens[:, None]
    for i, n in enumerate(lens.tolist()):
        tables[i, -(-n // bs) :] = 10**6  # padding: out of the pool, never in the context
    q = torch.randn(batch, kv_heads, group, head_dim, generator=gen)
    got = torch.ops.servebench.decode_attention(q, k, v, tables, mask, head_dim**-0.5)
    safe = tables.clamp(max=pool - 1)  # the formula reads every entry (masked after)
    want = cpu_decode_attention.decode_attention(q, k, v, safe, mask, head_dim**-0.5)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    bad = tables.clone()
    bad[0, 0] = pool  # a block in the context out of the pool: refused, not read
    with pytest.raises(RuntimeError, match="block"):
        torch.ops.servebench.decode_attention(q, k, v, bad, mask, 1.0)


@pytest.mark.parametrize(
    ("batch", "max_len", "head_dim", "group"), [(1, 1, 64, 3), (5, 100, 64, 1), (9, 300, 128, 4)]
)
def test_the_kernels_fp8_variant_computes_the_dequantized_formula(
    batch: int, max_len: int, head_dim: int, group: int
) -> None:
    """`servebench::decode_attention_fp8` over an e4m3 cache with a scale per KV head: what the
    formula computes on the dequantized cache, table padding unread."""
    assert cpu_kernels.available()
    gen = torch.Generator().manual_seed(batch)
    kv_heads, bs = 2, 16
    nb = -(-max_len // bs)
    pool = batch * nb + 3
    scales = [torch.tensor([0.01, 0.03]).view(kv_heads, 1, 1) for _ in "kv"]
    k, v = (quantize(torch.randn(kv_heads, pool, bs, head_dim, generator=gen), s[..., None])
            for s in scales)  # fmt: skip
    tables = torch.randperm(pool, generator=gen)[: batch * nb].view(batch, nb)
    lens = torch.randint(1, max_len + 1, (batch,), generator=gen)
    lens[0] = max_len
    mask = torch.arange(nb * bs)[None] < lens[:, None]
    for i, n in enumerate(lens.tolist()):
        tables[i, -(-n // bs) :] = 10**6
    q = torch.randn(batch, kv_heads, group, head_dim, generator=gen)
    got = torch.ops.servebench.decode_attention_fp8(q, k, v, tables, mask, 0.1, *scales)
    pairs = zip((k, v), scales, strict=True)
    kd, vd = (dequantize(c, s[..., None], torch.float32) for c, s in pairs)
    safe = tables.clamp(max=pool - 1)
    want = cpu_decode_attention.decode_attention(q, kd, vd, safe, mask, 0.1)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_an_fp8_cache_engine_decodes_through_the_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    """The eager forward's decodes over an fp8 cache take the kernel (no gather and
    dequantization of every block), with the gathering path's greedy tokens; so does the
    compiled forward."""
    calls = []
    real = cpu_decode_attention.fp8_kernel_fits

    def counting(dtype: torch.dtype, k_cache: torch.Tensor) -> bool:
        calls.append(real(dtype, k_cache))
        return calls[-1]

    monkeypatch.setattr(attention, "fp8_kernel_fits", counting)
    wide = replace(sources.TINY_CONFIGS["tiny-llama"], head_dim=64)  # the kernel's head sizes
    monkeypatch.setitem(sources.TINY_CONFIGS, "tiny-llama-64", wide)
    prompts = [[5, 9, 2, 7] * k for k in (1, 4, 9)]
    params = SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True)
    llm = LLM("tiny-llama-64", dtype="float32", kv_cache_dtype="fp8", enforce_eager=True)
    got = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
    assert calls and all(calls)
    monkeypatch.setattr(attention, "fp8_kernel_fits", lambda dtype, k_cache: False)
    want = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
    assert got == want
    # The compiled forward over the same cache: its decode graphs quantize and write K/V and
    # call the kernel themselves.
    compiled = LLM("tiny-llama-64", dtype="float32", kv_cache_dtype="fp8")
    assert compiled.llm_engine.model_forward == "compiled"
    assert [o.outputs[0].token_ids for o in compiled.generate(prompts, params)] == want
