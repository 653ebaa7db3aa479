"""SmolLM2-135M through our engine equals the Hugging Face transformers reference.

Tolerance: in float32, every logit of every generated position agrees within 2e-3 absolute
(logits here are O(10); the gap is summation-order noise), and greedy tokens are identical."""

from pathlib import Path

import pytest
import torch

from engine import LLM, SamplingParams
from engine.model.loader import resolve_model_path

pytestmark = pytest.mark.slow

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a land far away, there lived a",
    "1, 2, 3, 4,",
    "Translate to French: I would like a cup of coffee, please.",
    "Question: What is the boiling point of water at sea level in Celsius?\nAnswer:",
    "<|im_start|>user\nWrite a haiku about the sea.<|im_end|>\n<|im_start|>assistant\n",
    " ".join(f"The number {i} is {'even' if i % 2 == 0 else 'odd'}." for i in range(40)),
]
NEW_TOKENS = 32
LOGIT_ATOL = 2e-3


@pytest.fixture(scope="module")
def gguf_path() -> Path:
    return resolve_model_path("smollm2-135m")


@pytest.fixture(scope="module")
def hf_runs(gguf_path: Path) -> list[tuple[list[int], list[int], torch.Tensor]]:
    """(prompt ids, greedy output ids, logits [NEW_TOKENS, vocab]) per prompt, from transformers."""
    transformers = pytest.importorskip("transformers")
    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(gguf_path.parent), gguf_file=gguf_path.name, dtype=torch.float32
    )
    tok = transformers.AutoTokenizer.from_pretrained(
        str(gguf_path.parent), gguf_file=gguf_path.name
    )
    # Generate exactly NEW_TOKENS without masking EOS (min_new_tokens would suppress it, while
    # ignore_eos, like vLLM's, only keeps going past it).
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    runs = []
    with torch.inference_mode():
        for prompt in PROMPTS:
            ids = tok(prompt, return_tensors="pt").input_ids
            out = model.generate(
                ids,
                max_new_tokens=NEW_TOKENS,
                do_sample=False,
                return_dict_in_generate=True,
                output_logits=True,
            )
            gen = out.sequences[0, ids.shape[1] :].tolist()
            runs.append((ids[0].tolist(), gen, torch.cat(out.logits).float()))
    return runs


@pytest.fixture(scope="module")
def our_runs(monkeypatch_module: pytest.MonkeyPatch) -> tuple[list, dict[str, list[torch.Tensor]]]:
    """Our greedy outputs for all prompts in one batch, and the logits each step sampled from."""
    import engine.runner

    logits_by_request: dict[str, list[torch.Tensor]] = {}
    real_sample = engine.runner.sample

    def recording_sample(logits, requests, generator):  # type: ignore[no-untyped-def]
        for row, req in zip(logits, requests, strict=True):
            logits_by_request.setdefault(req.request_id, []).append(row.float())
        return real_sample(logits, requests, generator)

    monkeypatch_module.setattr(engine.runner, "sample", recording_sample)
    llm = LLM("smollm2-135m", dtype="float32", max_num_seqs=16)
    assert llm.llm_engine.decode_attention == "compiled"  # the default path is the one checked
    assert llm.llm_engine.model_forward == "compiled"
    params = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True)
    outs = llm.generate(PROMPTS, params)
    return outs, logits_by_request


@pytest.fixture(scope="module")
def monkeypatch_module():  # type: ignore[no-untyped-def]
    mp = pytest.MonkeyPatch()
    yield mp
    mp.undo()


def test_prompts_tokenize_like_the_reference(hf_runs, our_runs) -> None:  # type: ignore[no-untyped-def]
    outs, _ = our_runs
    for (ref_prompt, _, _), out in zip(hf_runs, outs, strict=True):
        assert out.prompt_token_ids == ref_prompt


def test_greedy_batch_of_eight_equals_transformers(hf_runs, our_runs) -> None:  # type: ignore[no-untyped-def]
    outs, _ = our_runs
    assert len({len(p) for p, _, _ in hf_runs}) == len(PROMPTS)  # all different lengths
    for (_, ref_gen, _), out in zip(hf_runs, outs, strict=True):
        assert out.outputs[0].token_ids == ref_gen


def test_logits_match_transformers_in_float32(hf_runs, our_runs) -> None:  # type: ignore[no-untyped-def]
    outs, logits_by_request = our_runs
    worst = 0.0
    for (_, _, ref_logits), out in zip(hf_runs, outs, strict=True):
        ours = torch.stack(logits_by_request[out.request_id])
        assert ours.shape == ref_logits.shape
        worst = max(worst, (ours - ref_logits).abs().max().item())
    assert worst < LOGIT_ATOL, f"max |logit difference| {worst:.2e}"
