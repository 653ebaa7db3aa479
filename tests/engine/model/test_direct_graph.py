"""DirectCompiled (engine/model/direct_graph.py) calls the graph dynamo chose for a kind of
call without dynamo afterwards, and only where that gives what dynamo gives."""

from __future__ import annotations

import gc

import pytest
import torch
from torch import nn

from engine.model.direct_graph import DirectCompiled


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.proj = nn.Linear(width, width)
        self.eps = 1e-6

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.proj(x)) / (x.abs().amax(-1, keepdim=True) + self.eps)


def layers_then_write(
    blocks: list[Block], x: torch.Tensor, out: torch.Tensor, rows: torch.Tensor
) -> torch.Tensor:
    for block in blocks:
        x = block(x)
    out.index_copy_(0, rows, x)  # written in-graph, as the decode graphs write the KV cache
    return x * 2


def mark(blocks: list[Block], x: torch.Tensor, out: torch.Tensor, rows: torch.Tensor) -> None:
    torch._dynamo.decorators.mark_unbacked(x, 0)
    torch._dynamo.decorators.mark_unbacked(rows, 0)


def _inputs(n: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """n rows of x, the buffer they are written to, and at which rows (the same for each n)."""
    gen = torch.Generator().manual_seed(n)
    return (
        torch.randn(n, 8, generator=gen),
        torch.zeros(16, 8),
        torch.randperm(16, generator=gen)[:n],
    )


def _call(f: DirectCompiled, blocks: list[Block], n: int) -> tuple[torch.Tensor, torch.Tensor]:
    x, out, rows = _inputs(n)
    return f(blocks[0], len(blocks), blocks, x, out, rows), out


def _want(blocks: list[Block], n: int) -> tuple[torch.Tensor, torch.Tensor]:
    x, out, rows = _inputs(n)
    return layers_then_write(blocks, x, out, rows), out


@torch.inference_mode()
def test_after_the_first_call_the_graph_is_called_directly_and_gives_what_dynamo_gives() -> None:
    torch.manual_seed(0)
    blocks = [Block(8), Block(8)]
    f = DirectCompiled(layers_then_write, {}, mark)
    _call(f, blocks, 3)
    assert f.direct_calls(blocks[0]) == 1
    calls = []
    real = f.compiled
    f.compiled = lambda *args: calls.append(args) or real(*args)  # type: ignore[method-assign]
    for n in (1, 3, 5):  # other sizes: the graph is dynamic in them
        got, out = _call(f, blocks, n)
        want, want_out = _want(blocks, n)
        torch.testing.assert_close(got, want)
        torch.testing.assert_close(out, want_out)
    assert not calls  # none went through dynamo
    with torch.no_grad():  # weights changed in place: the graph reads them as inputs
        blocks[1].proj.weight.mul_(-1)
    torch.testing.assert_close(_call(f, blocks, 2)[0], _want(blocks, 2)[0])
    other = [Block(8)]  # another owner, or another key: through dynamo first
    torch.testing.assert_close(_call(f, other, 2)[0], _want(other, 2)[0])
    assert len(calls) == 1 and f.direct_calls(other[0]) == 1


@torch.inference_mode()
def test_entries_die_with_their_owner() -> None:
    f = DirectCompiled(layers_then_write, {}, mark)
    blocks = [Block(8)]
    _call(f, blocks, 2)
    assert len(f.entries) == 1
    del blocks
    gc.collect()
    assert len(f.entries) == 0


def _with_break(blocks: list[Block], x: torch.Tensor) -> torch.Tensor:
    x = blocks[0](x)
    torch._dynamo.graph_break()
    return blocks[0](x)


def _break_first(blocks: list[Block], x: torch.Tensor) -> torch.Tensor:
    x.add_(1)  # eager, before the break: the one graph runs in a frame resumed after it
    torch._dynamo.graph_break()
    return blocks[0](x)


def _returns_more(blocks: list[Block], x: torch.Tensor) -> tuple[torch.Tensor, int]:
    return blocks[0](x), x.shape[0]  # dynamo builds the tuple after the graph


@pytest.mark.parametrize("fn", [_with_break, _break_first, _returns_more])
@torch.inference_mode()
def test_calls_that_are_not_one_graph_computing_the_result_keep_going_through_dynamo(
    fn: object,
) -> None:
    f = DirectCompiled(fn, {}, lambda *args: None)  # type: ignore[arg-type]
    block = Block(8)
    for _ in range(2):
        x = torch.randn(3, 8)
        want = fn([block], x.clone())  # type: ignore[operator]
        torch.testing.assert_close(f(block, "k", [block], x), want)
    assert f.direct_calls(block) == 0


@torch.inference_mode()
def test_direct_off_or_no_key_calls_through_dynamo_and_records_nothing() -> None:
    f = DirectCompiled(layers_then_write, {}, mark)
    f.direct = False
    blocks = [Block(8)]
    torch.testing.assert_close(_call(f, blocks, 2)[0], _want(blocks, 2)[0])
    assert f.direct_calls(blocks[0]) == 0
    f.direct = True
    x, out, rows = torch.randn(2, 8), torch.zeros(16, 8), torch.tensor([3, 5])
    f(blocks[0], None, blocks, x, out, rows)
    assert f.direct_calls(blocks[0]) == 0
