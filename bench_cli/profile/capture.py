"""`bench profile`: where the time of an engine step goes, by category, against this device's
measured peaks, with a torch profiler trace (Chrome trace JSON; Perfetto and chrome://tracing
open it).

A step of a fixed shape (B decodes at a given context, optionally beside a prefill chunk of P
tokens) is run three times over: plain, for the step time; with each category's code wrapped
in a timer, for the time by category (exclusive: the LM head's time is not also the engine's);
and under torch's profiler, for the trace and for how much of each category is spent inside
torch ops (the rest is Python and dispatch). Timers and profiler are attached to the engine's
objects for the capture and removed after: the engine itself carries no instrumentation."""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from statistics import median
from types import ModuleType
from typing import Any

import torch

from engine.core.request import SamplingParams
from engine.engine import LLMEngine
from engine.model import compiled_forward, triton_forward

ENGINE_REST = "engine (Python, rest)"
FORWARD_REST = "norm, rope, activation, residual"
COMPILED_REST = "compiled layers: norms, rope, activation, residual (decode steps: attention)"
CATEGORIES = (
    "linears",
    "attention",
    FORWARD_REST,
    COMPILED_REST,
    "LM head",
    "sampling",
    "scheduling",
    "input preparation",
    "detokenize, stop checks",
    ENGINE_REST,
)
SCOPE = "servebench/"
# What a linear layer runs as, eagerly and inside a compiled graph (engine/ops/cpu_linear.py).
LINEAR_OPS = frozenset(
    ("servebench::linear", "servebench::linear_fp8", "servebench::packed_linear",
     "mkldnn::_linear_pointwise", "aten::linear", "aten::mm", "aten::addmm")
)  # fmt: skip


class ProfileError(Exception):
    """The asked shape cannot be profiled (the engine would not run it as asked)."""


@dataclass
class Shape:
    batch: int = 8  # sequences decoding in every step
    context: int = 128  # tokens each of them holds when profiling starts
    prefill: int = 0  # prompt tokens of one more request computed in each step
    steps: int = 10  # steps measured in each pass
    warmup: int = 3  # steps run before each pass, not measured

    def validate(self) -> None:
        if self.batch < 0 or self.prefill < 0 or self.batch + self.prefill < 1:
            raise ProfileError("a step needs a decode (--batch) or a prefill chunk (--prefill)")
        if self.batch and self.context < 1:
            raise ProfileError("--context must be at least 1 token")
        if self.steps < 1 or self.warmup < 0:
            raise ProfileError("--steps must be at least 1 and --warmup at least 0")

    def engine_args(self) -> dict[str, Any]:
        """What the engine must allow so that every step has this shape: room for all the
        sequences and tokens, the prefill chunk capped at P, and no prefix reuse (its prompts
        are random, but a cached block would make a step compute less than asked)."""
        args: dict[str, Any] = {
            "max_num_seqs": self.batch + 1,
            "max_num_batched_tokens": max(2048, self.batch + self.prefill),
            "enable_prefix_caching": False,
        }
        if self.prefill:
            args["long_prefill_token_threshold"] = self.prefill
        return args


@dataclass
class Timers:
    """Exclusive wall time per category: a wrapped call's time minus that of wrapped calls
    inside it. Each wrapped call is also a `servebench/<category>` range in a trace. On a GPU
    `sync` waits for the device at both ends of a call, so that its kernels count in its own
    category rather than in whichever call next waits (the timed pass runs slower for it)."""

    seconds: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    sync: Callable[[], None] = lambda: None
    _stack: list[list[float]] = field(default_factory=list)  # [start, time in children]

    @contextmanager
    def clear_on_entry(self) -> Iterator[None]:
        """Count only what runs inside (warm-up steps ran before)."""
        self.seconds.clear()
        yield

    def wrap(self, category: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            with torch.profiler.record_function(SCOPE + category):
                self.sync()
                self._stack.append([time.perf_counter(), 0.0])
                try:
                    return fn(*args, **kwargs)
                finally:
                    self.sync()
                    start, children = self._stack.pop()
                    took = time.perf_counter() - start
                    self.seconds[category] += took - children
                    if self._stack:
                        self._stack[-1][1] += took

        return timed


def _targets(engine: LLMEngine, compiled: bool) -> Iterator[tuple[Any, str, str]]:
    """(object, attribute, category) of every call timed. Code that runs inside a compiled
    graph cannot be timed from Python (a timer there would break the graph): with the compiled
    forward, the forward is one category, split after into linears and the rest by the
    profiler's op times; a prefill step's attention, an op the graph calls, is timed apart."""
    model = engine.runner.model
    yield engine, "step", ENGINE_REST
    yield engine, "_process_token", "detokenize, stop checks"
    yield engine.scheduler, "schedule", "scheduling"
    yield engine.scheduler, "advance", "scheduling"
    yield engine.runner, "step_inputs", "input preparation"
    yield engine.runner, "build_inputs", "input preparation"
    yield engine.runner, "sample", "sampling"
    yield model, "compute_logits", "LM head"
    if compiled:
        yield compiled_forward, "decode_forward", COMPILED_REST
        yield compiled_forward, "step_forward", COMPILED_REST
        yield compiled_forward, "attend", "attention"  # steps with prefill: an op of its own
        return
    for parent, name in model._layer_linears():
        yield getattr(parent, name), "forward", "linears"
    if engine.runner.triton:  # the kernels are functions of one module, called through it
        from engine.ops import triton as kernels

        yield triton_forward, "forward", FORWARD_REST
        yield kernels, "write_kv_cache", "attention"
        yield kernels, "paged_attention", "attention"
        return
    yield model, "forward", FORWARD_REST
    for layer in model.layers:
        yield layer.self_attn.attn, "forward", "attention"


@contextmanager
def timed(engine: LLMEngine, compiled: bool) -> Iterator[Timers]:
    """Wrap the engine's calls in timers (attributes shadowing the methods and the compiled
    forward's function) for the duration of the block, and remove them after."""
    timers = Timers()
    if engine.device.type == "cuda":
        timers.sync = torch.cuda.synchronize
    wrapped = []
    for obj, attr, category in _targets(engine, compiled):
        original = getattr(obj, attr)
        setattr(obj, attr, timers.wrap(category, original))
        wrapped.append((obj, attr, original))
    try:
        yield timers
    finally:
        for obj, attr, original in wrapped:
            if isinstance(obj, ModuleType):
                setattr(obj, attr, original)
            else:
                delattr(obj, attr)


def ops_seconds(events: Any) -> tuple[dict[str, float], dict[str, float]]:
    """Per category: time in torch ops called directly from its code (profiler events whose
    parent is a `servebench/` range), and time in linear ops anywhere below it."""
    direct: dict[str, float] = defaultdict(float)
    linear: dict[str, float] = defaultdict(float)
    for e in events:
        if e.name.startswith(SCOPE) and e.name not in LINEAR_OPS:
            continue
        parent = e.cpu_parent
        if parent is not None and parent.name.startswith(SCOPE):
            direct[parent.name.removeprefix(SCOPE)] += e.time_range.elapsed_us() / 1e6
        if e.name in LINEAR_OPS:
            while parent is not None and not parent.name.startswith(SCOPE):
                if parent.name in LINEAR_OPS:
                    break  # counted at the outer linear op
                parent = parent.cpu_parent
            else:
                if parent is not None:
                    linear[parent.name.removeprefix(SCOPE)] += e.time_range.elapsed_us() / 1e6
    return direct, linear


def _add_requests(engine: LLMEngine, shape: Shape, vocab: int, max_tokens: int) -> None:
    gen = torch.Generator().manual_seed(0)
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    for i in range(shape.batch):
        prompt = torch.randint(0, vocab, (shape.context,), generator=gen).tolist()
        engine.add(engine.make_request(f"profile-decode-{i}", prompt, params))


def _check_step(engine: LLMEngine, shape: Shape, step: int) -> None:
    last = engine._last_step
    want_seqs = shape.batch + (1 if shape.prefill else 0)
    if last["num_tokens"] != shape.batch + shape.prefill or last["num_seqs"] != want_seqs:
        raise ProfileError(
            f"step {step} computed {last['num_tokens']} tokens of {last['num_seqs']} sequences, "
            f"not {shape.batch} decodes + {shape.prefill} prefill tokens (is the KV cache "
            f"large enough? see --num-kv-blocks)"
        )


@dataclass
class Pass:
    durations: list[float] = field(default_factory=list)
    decode_context: list[int] = field(default_factory=list)  # keys the decodes read, summed
    prefill_start: list[int] = field(default_factory=list)  # where the step's chunk starts


def _run_pass(
    engine: LLMEngine,
    shape: Shape,
    vocab: int,
    name: str,
    measured: Callable[[], AbstractContextManager[Any]] = nullcontext,
) -> Pass:
    """warmup + steps steps of the shape, the last `steps` inside `measured()`."""
    prefill_id = f"profile-prefill-{name}"
    if shape.prefill:
        gen = torch.Generator().manual_seed(1)
        n = shape.prefill * (shape.warmup + shape.steps) + 1  # never finishes in the pass
        prompt = torch.randint(0, vocab, (n,), generator=gen).tolist()
        engine.add(engine.make_request(prefill_id, prompt, SamplingParams(max_tokens=1)))
    out = Pass()
    try:
        for i in range(shape.warmup):
            engine.step()
            _check_step(engine, shape, i)
        with measured():
            for i in range(shape.warmup, shape.warmup + shape.steps):
                running = engine.scheduler.running
                out.decode_context.append(sum(r.num_tokens for r in running if r.num_output_tokens))
                out.prefill_start.append(
                    next((r.num_computed_tokens for r in running if not r.num_output_tokens), 0)
                )
                t0 = time.perf_counter()
                engine.step()
                out.durations.append(time.perf_counter() - t0)
                _check_step(engine, shape, i)
    finally:
        if shape.prefill:
            engine.abort_request(prefill_id)
    return out


def capture(engine: LLMEngine, shape: Shape, out_dir: Path) -> dict[str, Any]:
    """Run the three passes on `engine` (built with `shape.engine_args()`), write the trace
    to out_dir/trace.json; returns per-step medians and means (see `analyse`)."""
    shape.validate()
    vocab = engine.runner.model.config.vocab_size
    if engine.has_unfinished_requests():
        raise ProfileError("the engine has requests of its own: profile a fresh engine")
    per_pass = shape.warmup + shape.steps
    # The first prompts in decode while later ones prefill: they need as many more tokens.
    budget = engine.config.scheduler.max_num_batched_tokens or 1
    setup_steps = -(-shape.batch * shape.context // budget) + 1
    _add_requests(engine, shape, vocab, max_tokens=3 * per_pass + setup_steps + 2)
    # Prompts in: every decode sequence has its first token before the passes start.
    while engine.scheduler.num_waiting or any(
        not r.num_output_tokens for r in engine.scheduler.running
    ):
        engine.step()
    plain = _run_pass(engine, shape, vocab, "plain")
    compiled = engine.runner.compiled_forward
    with timed(engine, compiled) as timers:
        timed_pass = _run_pass(engine, shape, vocab, "timed", timers.clear_on_entry)
        by_category = {c: timers.seconds.get(c, 0.0) / shape.steps for c in CATEGORIES}
        prof = torch.profiler.profile(activities=_activities())
        profiled = _run_pass(engine, shape, vocab, "profiled", lambda: prof)
    for request_id in list(engine.requests):
        engine.abort_request(request_id)
    out_dir.mkdir(parents=True, exist_ok=True)
    prof.export_chrome_trace(str(out_dir / "trace.json"))
    ops, linear_ops = ops_seconds(prof.events())
    if compiled:  # the linears' share of the compiled forward, as the profiler timed them
        forward = by_category[COMPILED_REST]
        by_category["linears"] = min(forward, linear_ops[COMPILED_REST] / shape.steps)
        by_category[COMPILED_REST] = forward - by_category["linears"]
        ops["linears"] = linear_ops[COMPILED_REST]
        ops[COMPILED_REST] -= linear_ops[COMPILED_REST]
    return {
        "step_s": median(plain.durations),
        "timed_step_s": median(timed_pass.durations),
        "profiled_step_s": median(profiled.durations),
        # Of the timed pass, whose category times the rates divide by.
        "decode_context": sum(timed_pass.decode_context) / shape.steps,
        "prefill_start": sum(timed_pass.prefill_start) / shape.steps,
        "category_s": by_category,
        "ops_s": {c: ops.get(c, 0.0) / shape.steps for c in CATEGORIES},
    }


def _activities() -> list[torch.profiler.ProfilerActivity]:
    acts = [torch.profiler.ProfilerActivity.CPU]
    if torch.cuda.is_available():
        acts.append(torch.profiler.ProfilerActivity.CUDA)
    return acts
