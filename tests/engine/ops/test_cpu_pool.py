"""The kernels' own thread pool (engine/ops/cpu_pool.h, engine/kernel_pool.py): the same bits
as ATen's threads at every split, callers from two threads at once, and which engines take it."""

import contextlib
import subprocess
import sys
import threading
from collections.abc import Iterator

import pytest
import torch
from torch import nn

from engine import kernel_pool
from engine.ops import cpu_kernels
from engine.ops.cpu_decode_attention import paged_decode_attention
from engine.ops.cpu_linear import PackedLinear
from engine.ops.fp8 import FP8, Fp8Linear

pytestmark = pytest.mark.skipif(not cpu_kernels.available(), reason="CPU kernels not built")


@contextlib.contextmanager
def _restored() -> Iterator[None]:
    """The pool's and torch's threads as they were (an engine built earlier in this process
    may hold the pool)."""
    pool, threads = torch.ops.servebench.pool_threads(), torch.get_num_threads()
    try:
        yield
    finally:
        torch.ops.servebench.set_pool_threads(pool, kernel_pool.SPIN_US)
        torch.set_num_threads(threads)


@pytest.fixture
def pool() -> Iterator[None]:
    """A pool of 3 threads (more than this machine's 2 cores: a partner is often not
    running)."""
    with _restored():
        torch.ops.servebench.set_pool_threads(3, kernel_pool.SPIN_US)
        yield


def _products(packed: list[PackedLinear], xs: list[torch.Tensor]) -> list[torch.Tensor]:
    with torch.inference_mode():
        return [p(x) for p, x in zip(packed, xs, strict=True)]


def _layers(dtype: torch.dtype) -> tuple[list[PackedLinear], list[torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    packed, xs = [], []
    for rows, (k, n) in [(1, (576, 1536)), (3, (101, 163)), (8, (160, 96)), (13, (576, 49))]:
        w = torch.randn(n, k, generator=g).to(dtype)
        packed.append(PackedLinear(w))
        xs.append(torch.randn(rows, k, generator=g).to(dtype))
    return packed, xs


DTYPES = [torch.float32] + ([torch.bfloat16] if cpu_kernels.bf16_available() else [])


@pytest.mark.parametrize("dtype", DTYPES)
def test_linears_on_the_pool_give_atens_bits(dtype: torch.dtype) -> None:
    """Each output is one chunk's, computed as before: the split changes no bit."""
    packed, xs = _layers(dtype)
    with _restored():
        torch.ops.servebench.set_pool_threads(1, kernel_pool.SPIN_US)
        torch.set_num_threads(2)
        want = _products(packed, xs)  # ATen's threads
        torch.ops.servebench.set_pool_threads(3, kernel_pool.SPIN_US)
        torch.set_num_threads(1)
        for _ in range(20):
            for got, expected in zip(_products(packed, xs), want, strict=True):
                assert torch.equal(got, expected)


def test_decode_attention_on_the_pool_gives_atens_bits(pool: None) -> None:
    g = torch.Generator().manual_seed(1)
    kv_heads, blocks, bs, d, b, group = 3, 12, 16, 64, 5, 3
    k = torch.randn(kv_heads, blocks, bs, d, generator=g)
    v = torch.randn(kv_heads, blocks, bs, d, generator=g)
    q = torch.randn(b, kv_heads, group, d, generator=g)
    tables = torch.randint(0, blocks, (b, 4), generator=g)
    mask = torch.rand(b, 4 * bs, generator=g) < 0.8
    args = (q, k, v, tables, mask, 0.125)
    got = paged_decode_attention(*args)
    torch.ops.servebench.set_pool_threads(1, kernel_pool.SPIN_US)
    torch.set_num_threads(2)
    assert torch.equal(got, paged_decode_attention(*args))


def test_two_callers_at_once_each_get_their_own_products(pool: None) -> None:
    """One caller has the pool, the other runs on its own thread meanwhile: neither takes
    the other's chunks."""
    packed, xs = _layers(torch.float32)
    want = _products(packed, xs)
    wrong: list[int] = []

    def call() -> None:
        for i in range(100):
            if not all(torch.equal(a, b) for a, b in zip(_products(packed, xs), want, strict=True)):
                wrong.append(i)

    callers = [threading.Thread(target=call) for _ in range(2)]
    for t in callers:
        t.start()
    for t in callers:
        t.join()
    assert wrong == []


class _Tiny(nn.Module):
    def __init__(self, dtype: torch.dtype, layer: nn.Module) -> None:
        super().__init__()
        self.embed = nn.Embedding(8, 16, dtype=dtype)
        self.layer = layer


def test_the_pool_is_taken_only_where_every_heavy_op_is_the_kernels(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("SERVEBENCH_CPU_POOL", raising=False)
    w = torch.randn(32, 16)
    packed = _Tiny(torch.float32, PackedLinear(w))
    assert kernel_pool.plan(packed, torch.float32, 64, 2).pool_threads == 2
    plain = _Tiny(torch.float32, nn.Linear(16, 32, bias=False))
    assert "Linear" in kernel_pool.plan(plain, torch.float32, 64, 2).reason
    fp8 = _Tiny(torch.float32, Fp8Linear.from_linear(nn.Linear(16, 32, bias=False)))
    assert kernel_pool.plan(fp8, torch.float32, 64, 2).pool_threads == 1
    assert kernel_pool.plan(packed, FP8, 64, 2).pool_threads == 1  # SDPA prefill
    assert kernel_pool.plan(packed, torch.float32, 96, 2).pool_threads == 1  # head not fitted
    assert kernel_pool.plan(packed, torch.float32, 64, 1).pool_threads == 1
    monkeypatch.setenv("SERVEBENCH_CPU_POOL", "0")
    assert kernel_pool.plan(packed, torch.float32, 64, 2).pool_threads == 1


def test_an_engine_without_the_pool_gives_torch_its_threads_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Whatever earlier tests of this process left (an engine's pool, one thread): from 3
    threads, the pool takes them, a measurement gets them back for a while, and an engine
    that takes no pool gives them back to torch."""
    monkeypatch.delenv("SERVEBENCH_CPU_POOL", raising=False)
    monkeypatch.setattr(kernel_pool, "_threads", {"torch": 0})
    monkeypatch.setattr(kernel_pool, "_taken", [])
    packed = _Tiny(torch.float32, PackedLinear(torch.randn(32, 16)))
    plain = _Tiny(torch.float32, nn.Linear(16, 32, bias=False))
    with _restored():
        torch.set_num_threads(3)
        assert kernel_pool.take_threads(packed, torch.float32, 64).pool_threads == 3
        assert torch.get_num_threads() == 1 and torch.ops.servebench.pool_threads() == 3
        assert kernel_pool.take_threads(packed, torch.float32, 64).pool_threads == 3
        with kernel_pool.machine_threads():  # what bench_cli/device_peak.py measures with
            assert torch.get_num_threads() == 3
        assert torch.get_num_threads() == 1
        taken = kernel_pool.take_threads(plain, torch.float32, 64)
        assert kernel_pool.current() == taken and taken.pool_threads == 1
        assert torch.get_num_threads() == 3 and torch.ops.servebench.pool_threads() == 1


FORK = """
import ctypes, os, sys, time
import torch
from engine.ops import cpu_kernels
from engine.ops.cpu_linear import PackedLinear
assert cpu_kernels.available()
torch.ops.servebench.set_pool_threads(3, 100)
torch.set_num_threads(1)  # as in an engine's process: libgomp's own team hangs after a fork
packed, x = PackedLinear(torch.randn(1536, 576)), torch.randn(8, 576)
with torch.inference_mode():
    want = packed(x)
pid = os.fork()
if pid == 0:
    with torch.inference_mode():
        same = torch.equal(packed(x), want)
    ctypes.CDLL(None).exit(0 if same and torch.ops.servebench.pool_threads() == 1 else 3)
deadline = time.monotonic() + 60
while (done := os.waitpid(pid, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
    time.sleep(0.05)
if done[0] == 0:
    os.kill(pid, 9)
    sys.exit("the forked child did not exit within 60 s")
print("child exit", os.waitstatus_to_exitcode(done[1]))
"""


def test_a_forked_child_computes_and_exits_without_the_parents_workers() -> None:
    """Only the forking thread lives in the child: its kernels run without the pool, and its
    exit (C's, static destructors included) does not wait for workers it does not have. In a
    process of its own: a test worker's other state is no part of it."""
    done = subprocess.run(
        [sys.executable, "-c", FORK], capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0 and "child exit 0" in done.stdout, done.stdout + done.stderr
