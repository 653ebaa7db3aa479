"""Exporting a model as a Hugging Face directory: our loader and transformers read it back
as the same model, and the tokenizer travels with it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from engine.model.export import export_hf_dir
from engine.model.loader import load_model

os.environ.setdefault("HF_HUB_OFFLINE", "1")
CPU = torch.device("cpu")
IDS = torch.tensor([5, 17, 99, 3, 200, 42, 7, 128, 64, 1, 250, 33])


def _plain_logits(name_or_dir: str) -> torch.Tensor:
    """Next-token logits at every position, through our engine."""
    from engine import LLM

    llm = LLM(name_or_dir, dtype="float32", num_kv_blocks=8)
    return llm.llm_engine.prompt_logits(IDS.tolist())


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-llama-untied", "tiny-smollm2"])
def test_export_loads_back_as_the_same_model(name: str, tmp_path: Path) -> None:
    loaded = load_model(name, torch.float32, CPU, seed=4)
    out = export_hf_dir(loaded, tmp_path / name)
    back = load_model(str(out), torch.float32, CPU)
    assert back.config == loaded.config
    want = dict(loaded.model.state_dict())
    got = dict(back.model.state_dict())
    assert want.keys() == got.keys()
    for key in want:
        assert torch.equal(want[key], got[key]), key
    if name == "tiny-smollm2":
        assert back.tokenizer is not None and loaded.tokenizer is not None
        text = "Hello, world: x   1 + 23 = ünïcode\n\tdef f(): return 42"
        assert back.tokenizer.encode(text) == loaded.tokenizer.encode(text)
        assert back.tokenizer.eos_token_ids == loaded.tokenizer.eos_token_ids
        assert back.tokenizer.chat_template == loaded.tokenizer.chat_template


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-llama-untied"])
def test_transformers_reads_the_export_as_the_same_model(name: str, tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    out = export_hf_dir(load_model(name, torch.float32, CPU), tmp_path / name)
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32).eval()
    with torch.inference_mode():
        want = hf(IDS[None]).logits[0]
    torch.testing.assert_close(_plain_logits(str(out)), want, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("change", ["quantize_fp8", "pack_for_cpu"])
def test_a_quantized_or_packed_model_is_refused(change: str, tmp_path: Path) -> None:
    loaded = load_model("tiny-llama-untied", torch.float32, CPU)
    getattr(loaded.model, change)()
    with pytest.raises(ValueError, match="before fp8"):
        export_hf_dir(loaded, tmp_path / "q")


def test_bench_export_model(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from bench_cli.app import app

    result = CliRunner().invoke(app, ["export-model", "tiny-smollm2", str(tmp_path / "m")])
    assert result.exit_code == 0, result.output
    assert "wrote" in result.output
    back = load_model(str(tmp_path / "m"), torch.float32, CPU)
    assert back.tokenizer is not None and back.config.vocab_size == 49152
    missing = CliRunner().invoke(app, ["export-model", str(tmp_path / "nope"), str(tmp_path / "x")])
    assert missing.exit_code == 2 and "nope" in missing.output
    assert not (tmp_path / "x").exists()
