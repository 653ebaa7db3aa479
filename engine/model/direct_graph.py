"""A torch.compile'd function whose graph, once dynamo has chosen it for a kind of call, is
called directly for every later call of that kind.

Each call of a compiled function pays dynamo before the graph runs: guards over every module
attribute, weight and input it read (~2,000 of them for five SmolLM2 layers), and a walk
over the modules to collect the weights. Measured here at one sequence, ~0.35 ms of a ~3 ms
five-layer decode graph, ~2 ms of a ~21 ms step (six graphs). The caller names a call's kind
with a key that fixes, for its calls, what those guards check (the modules, dtypes, layouts,
static shapes); grad and inference mode are added. The first call of a key goes through
dynamo, which compiles or picks a graph, and is watched: where the function's own frame ran
exactly one graph and it produced the result, each of the graph's inputs is found again by
the expression dynamo reached it by (`L['layers'][0]._modules['mlp']...`, `L['x'].size()[0]`)
and checked against what dynamo passed. Later calls of that key evaluate those expressions and
call the graph. vLLM's compile wrapper dispatches to dynamo's compiled code without guards
for the same reason. A key of None, and calls whose key was never recorded (a graph break,
dynamo running the function eagerly), go through dynamo every time.

What a key cannot say, the caller must keep fixed: global state other than grad mode
(autocast, default dtype), globals the function reads, and which arguments are one object
(dynamo passes a tensor given twice once, and a later call passing two would get the first
twice). The function must be pure apart from the tensors it writes in-graph (Python side
effects dynamo replays are skipped), and is called with every argument, by position."""

from __future__ import annotations

import inspect
import os
import sys
import threading
import weakref
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any

import torch


@dataclass
class _Graph:
    """A graph dynamo compiled, and the expressions its inputs came from."""

    run: Callable[..., Any]
    sources: list[str | None]


@dataclass
class _Direct:
    """A recorded kind of call: the graph, and how to gather its inputs from the arguments."""

    run: Callable[..., Any]
    inputs: Callable[[dict[str, Any]], list[Any]]  # the arguments by name -> graph inputs


class DirectCompiled:
    """`fn` compiled by inductor with `options`; `self(owner, key, *args)` calls it. `owner`
    (a module the call reads) and `key` together must determine the graph: entries die with
    their owner, so an id reused by a later object finds nothing. `mark(*args)` runs before
    each call through dynamo: it marks the sizes that vary (dynamo guards a size it was not
    told varies, and a direct call checks no guard)."""

    def __init__(
        self, fn: Callable[..., Any], options: dict[str, Any], mark: Callable[..., None]
    ) -> None:
        self.params = list(inspect.signature(fn).parameters)
        self.name = fn.__name__  # a graph run from another frame (a graph break's) is not it
        self.options = options
        self.mark = mark
        self.compiled = torch.compile(fn, backend=self._compile, dynamic=False)
        self.entries: weakref.WeakKeyDictionary[Any, dict[Hashable, _Direct]] = (
            weakref.WeakKeyDictionary()
        )
        self._seen = threading.local()  # graphs run during the dynamo call being watched
        self.direct = True  # False: every call through dynamo (benchmarks/decode_paths.py)

    def _compile(self, gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable:
        from torch._inductor.compile_fx import compile_fx  # ~2 s to import: only to compile

        graph = _Graph(compile_fx(gm, example_inputs, config_patches=self.options), [])
        for node in gm.graph.nodes:
            if node.op == "placeholder":
                arg = node.meta.get("grapharg")
                graph.sources.append(arg.source.name if arg is not None else None)

        def run(*args: Any) -> Any:
            out = graph.run(*args)
            seen = getattr(self._seen, "calls", None)
            if seen is not None:
                seen.append((graph, args, out, _caller()))
            return out

        return run

    def __call__(self, owner: Any, key: Hashable | None, *args: Any) -> Any:
        if key is not None:
            key = (key, torch.is_grad_enabled(), torch.is_inference_mode_enabled())
        entry = self.entries.get(owner, {}).get(key) if self.direct else None
        if entry is not None:
            local = dict(zip(self.params, args, strict=True))
            return entry.run(*entry.inputs(local))[0]
        self.mark(*args)  # (on calls through dynamo only: ~1 us a tensor)
        if not self.direct or key is None:
            return self.compiled(*args)
        self._seen.calls = []
        try:
            result = self.compiled(*args)
        finally:
            seen, self._seen.calls = self._seen.calls, None
        if len(seen) == 1 and seen[0][3] == self.name:
            direct = _recorded(*seen[0][:3], result, dict(zip(self.params, args, strict=True)))
            if direct is not None:
                self.entries.setdefault(owner, {})[key] = direct
        return result

    def direct_calls(self, owner: Any) -> int:
        """Kinds of call recorded for `owner` (tests)."""
        return len(self.entries.get(owner, {}))


_TORCH = os.path.dirname(torch.__file__)  # frames of torch's own wrappers live here


def _caller() -> str:
    """The name of the code that ran the graph, torch's wrappers skipped: dynamo's code for the
    frame it compiled (the function's name, or a `torch_dynamo_resume_in_...` one)."""
    frame = sys._getframe(2)
    while frame is not None and frame.f_code.co_filename.startswith(_TORCH):
        frame = frame.f_back
    return frame.f_code.co_name if frame is not None else ""


def _recorded(
    graph: _Graph, args: tuple, out: Any, result: Any, local: dict[str, Any]
) -> _Direct | None:
    """The direct call for what dynamo just did, if every input is found again where dynamo
    found it and the graph's one output is what the function returned."""
    if not (isinstance(out, list | tuple) and len(out) == 1 and out[0] is result):
        return None
    if None in graph.sources:
        return None
    try:  # one function for all inputs: a call each costs more than the walk to most of them
        inputs = eval(f"lambda L: [{', '.join(graph.sources)}]", {})  # dynamo's own source text
        values = inputs(local)
    except Exception:
        return None
    for value, arg in zip(values, args, strict=True):
        same = (
            value is arg if isinstance(arg, torch.Tensor) else type(value) is int and value == arg
        )
        if not same:
            return None
    return _Direct(graph.run, inputs)
