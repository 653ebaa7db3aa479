"""The compiled forward (engine/model/compiled_forward.py) computes what the eager model does,
is what the engine runs by default, and stays off where it does not apply (enforce_eager, an
fp8 cache) or cannot compile."""

from __future__ import annotations

import copy
from dataclasses import replace

import pytest
import torch

from engine import LLM, SamplingParams
from engine.model import compiled_forward, sources

PROMPTS = [[5, 9, 2, 7] * k for k in (1, 4, 9)] + [[3] * 40]  # 1 to 3 blocks of 16


@pytest.fixture(scope="module", autouse=True)
def fresh_dynamo() -> None:
    """Dynamo's caches as a new process has them: these tests count compiles and direct calls,
    and a test process runs whichever modules it is handed before this one (the graphs of
    one kind failed to be recorded after other modules' compiles in the same process)."""
    torch._dynamo.reset()
    compiled_forward._compiled.cache_clear()
    compiled_forward._compiled_shapes.clear()


def _greedy(llm: LLM, max_tokens: int = 12) -> list[list[int]]:
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    return [o.outputs[0].token_ids for o in llm.generate(PROMPTS, params)]


@pytest.mark.parametrize("model", ["tiny-llama", "tiny-llama-untied"])
@pytest.mark.parametrize("budget", [2048, 16])
def test_compiled_forward_gives_the_eager_engines_tokens(model: str, budget: int) -> None:
    """budget 16: prompts in chunks that continue earlier ones (the masked prefill path),
    beside decodes of the prompts already in."""
    compiled = LLM(model, dtype="float32", max_num_batched_tokens=budget)
    eager = LLM(model, dtype="float32", max_num_batched_tokens=budget, enforce_eager=True)
    assert compiled.llm_engine.model_forward == "compiled"
    assert eager.llm_engine.model_forward == "eager"
    assert _greedy(compiled) == _greedy(eager)


def test_every_step_runs_one_of_the_compiled_kinds(monkeypatch: pytest.MonkeyPatch) -> None:
    """Steps of decodes only run the decode kind, one batch size at a time as requests finish;
    steps with prefill (here every prompt in one first step) the step kind."""
    llm = LLM("tiny-llama", dtype="float32")
    calls: list[tuple[str, int]] = []
    for kind in ("decode_forward", "step_forward"):
        real = getattr(compiled_forward, kind)

        def counting(model, input_ids, *args, kind=kind, real=real):  # type: ignore[no-untyped-def]
            calls.append((kind, len(input_ids)))
            return real(model, input_ids, *args)

        monkeypatch.setattr(compiled_forward, kind, counting)
    params = [SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True) for n in (3, 5, 8, 8)]
    llm.generate(PROMPTS, params)
    prompt_tokens = sum(map(len, PROMPTS))
    decodes = [("decode_forward", b) for b in (4, 4, 3, 3, 2, 2, 2)]
    assert calls == [("step_forward", prompt_tokens), *decodes]


def test_decode_graphs_of_several_layers_and_a_shorter_last_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Three layers at two a graph: a decode step calls the decode graph with layers 0-1, then
    with layer 2 (a graph of its own length, compiled at start), and generates what the
    eager model does."""
    three = replace(sources.TINY_CONFIGS["tiny-llama"], num_layers=3)
    monkeypatch.setitem(sources.TINY_CONFIGS, "tiny-llama-3", three)
    monkeypatch.setattr(compiled_forward, "LAYERS_PER_GRAPH", 2)
    compiled = LLM("tiny-llama-3", dtype="float32")
    assert compiled.llm_engine.model_forward == "compiled"
    real = compiled_forward._compiled
    sizes: list[int] = []
    through_dynamo: list[int] = []  # graph lengths of the calls that went through dynamo
    dynamo = real("decode").compiled
    monkeypatch.setattr(
        real("decode"), "compiled", lambda *a: through_dynamo.append(len(a[0])) or dynamo(*a)
    )

    def counting(owner, key, layers, *args):  # type: ignore[no-untyped-def]
        sizes.append(len(layers))
        return real("decode")(owner, key, layers, *args)

    monkeypatch.setattr(
        compiled_forward, "_compiled", lambda kind: counting if kind == "decode" else real(kind)
    )
    got = _greedy(compiled, 4)
    assert sizes == [2, 1] * 3  # 3 decode steps after the prefill's
    assert through_dynamo == [2, 1]  # the first decode step's; later ones call the graphs
    assert got == _greedy(LLM("tiny-llama-3", dtype="float32", enforce_eager=True), 4)


@pytest.mark.parametrize("kv_cache_dtype", ["auto", "fp8"])
def test_no_step_compiles_after_warm_up(
    monkeypatch: pytest.MonkeyPatch, kv_cache_dtype: str
) -> None:
    """Warm-up compiles every graph a run takes: one sequence and several, one block each and
    several, prompts in chunks beside decodes, a one-token step. (A size of 1 that dynamo
    specialized compiled again mid-run, as did caches made in inference mode at warm-up, and
    an fp8 cache's scales, one pair for every scratch layer.) A config of this test's own, so
    that no other test's run compiled its graphs first; heads of 64 for the fp8 kernel."""
    own = replace(sources.TINY_CONFIGS["tiny-llama"], intermediate_size=160, head_dim=64)
    name = f"tiny-llama-warm-{kv_cache_dtype}"
    monkeypatch.setitem(sources.TINY_CONFIGS, name, own)
    llm = LLM(name, dtype="float32", max_num_batched_tokens=16, kv_cache_dtype=kv_cache_dtype)
    assert llm.llm_engine.model_forward == "compiled"
    with torch.compiler.set_stance("fail_on_recompile"):
        for prompts in ([[5, 9, 2]], PROMPTS, [[7]]):
            params = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
            assert all(len(o.outputs[0].token_ids) == 4 for o in llm.generate(prompts, params))


def plain_copy(layer: torch.nn.Module) -> torch.nn.Module:
    """A copy of the layer with plain linears (bf16 ones are the kernel's blocks where it
    runs), so that `.float()` gives its float32 computation."""
    from engine.ops.cpu_linear import PackedLinear

    layer = copy.deepcopy(layer)
    for parent in list(layer.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, PackedLinear):
                plain = torch.nn.Linear(child.in_features, child.out_features, bias=False)
                plain.weight.data = child.plain_weight()
                setattr(parent, name, plain)
    return layer


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("batch", [1, 3])
def test_a_compiled_layer_equals_the_eager_layer(dtype: torch.dtype, batch: int) -> None:
    llm = LLM("tiny-llama", dtype="float32" if dtype == torch.float32 else "bfloat16")
    model = llm.llm_engine.runner.model
    cache = llm.llm_engine.runner.kv_caches[0]
    heads, _, block_size, head_dim = cache.k.shape
    gen = torch.Generator().manual_seed(batch)
    k = torch.randn(heads, 8, block_size, head_dim, generator=gen).to(cache.k.dtype)
    v = torch.randn(heads, 8, block_size, head_dim, generator=gen).to(cache.k.dtype)
    x = torch.randn(batch, model.config.hidden_size, generator=gen).to(dtype)
    lens = torch.tensor([40, 17, 33])[:batch]
    tables = torch.tensor([[7, 2, 5], [0, 3, 1], [6, 4, 1]])[:batch]
    positions = lens - 1
    slots = (
        tables[torch.arange(batch), positions // block_size] * block_size + positions % block_size
    )
    mask = torch.arange(3 * block_size)[None] < lens[:, None]
    cos_sin = model.cos_sin[positions]
    layer = model.layers[1]
    with torch.inference_mode():
        want_k, want_v = k.clone(), v.clone()
        want = layer.decode(x, cos_sin, want_k, want_v, slots, tables, mask)
        for _ in range(2):  # through dynamo, then the graph it chose called directly
            got_k, got_v = k.clone(), v.clone()
            got = compiled_forward._decode_graph(
                [layer], x, cos_sin, [got_k], [got_v], slots, tables, mask, None
            )
    assert compiled_forward._compiled("decode").direct_calls(layer)
    if dtype == torch.float32:  # sums in another order (AVX-512 lanes: 2e-5 seen)
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(got_k, want_k, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(got_v, want_v, rtol=1e-4, atol=1e-4)
    else:
        # Inductor keeps a fused chain's intermediates in float32 where eager rounds each op's
        # output to bf16: the two differ by a few roundings, and the compiled one is no
        # further from the float32 computation than the eager one.
        with torch.inference_mode():
            exact_k, exact_v = k.float(), v.float()
            exact = (
                plain_copy(layer)
                .float()
                .decode(x.float(), cos_sin.float(), exact_k, exact_v, slots, tables, mask)
            )
        for g, w, e in ((got, want, exact), (got_k, want_k, exact_k), (got_v, want_v, exact_v)):
            eager_err = (w.float() - e).abs().max().item()
            compiled_err = (g.float() - e).abs().max().item()
            assert compiled_err <= 1.5 * eager_err + 1e-6, (compiled_err, eager_err)


def test_fp8_weights_compile_and_an_fp8_cache_and_enforce_eager_stay_eager() -> None:
    fp8 = LLM("tiny-llama", quantization="fp8").llm_engine
    assert fp8.model_forward == "compiled" and fp8.linears == "fp8 kernel"
    assert LLM("tiny-llama", kv_cache_dtype="fp8").llm_engine.model_forward == "eager"
    assert LLM("tiny-llama", enforce_eager=True).llm_engine.model_forward == "eager"


@pytest.mark.parametrize("kind", ["decode", "step"])
def test_warm_up_refuses_a_wrong_compiled_layer(monkeypatch: pytest.MonkeyPatch, kind: str) -> None:
    real = compiled_forward._compiled

    def compiled(k: str):  # type: ignore[no-untyped-def]
        if k != kind:
            return real(k)
        return lambda owner, key, *args: compiled_forward.KINDS[k](*args) + 0.01

    monkeypatch.setattr(compiled_forward, "_compiled", compiled)
    monkeypatch.setattr(compiled_forward, "_compiled_shapes", set())
    with pytest.raises(RuntimeError, match=f"compiled {kind} forward disagrees"):
        LLM("tiny-llama", dtype="float32")


def test_a_machine_that_cannot_compile_runs_eager(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*args):  # type: ignore[no-untyped-def]
        raise RuntimeError("no C++ compiler")

    monkeypatch.setattr(compiled_forward, "_compiled", lambda kind: broken)
    monkeypatch.setitem(compiled_forward._state, "enabled", True)
    monkeypatch.setattr(compiled_forward, "_compiled_shapes", set())
    llm = LLM("tiny-llama", dtype="float32")
    assert llm.llm_engine.model_forward == "eager"
    assert len(_greedy(llm, 3)[0]) == 3  # and it still generates
