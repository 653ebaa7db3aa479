"""What `bench run --base-url` pays before its first request (issue 17, defect 10): it must
not import torch, and SmolLM2's tokenizer comes from a cache instead of parsing the whole GGUF
file each time; the cached tokenizer must behave exactly like the parsed one."""

from __future__ import annotations

import copy
import io
import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest
from rich.console import Console

from engine.model import sources
from engine.model.sources import cache_dir, load_tokenizer, resolve_model_path
from engine.model.tokenizer import Tokenizer
from loadgen import workload
from loadgen.workload import PromptBuilder, WorkloadConfig, synthetic

TEXTS = [
    "",
    "Hello world",
    "The quick brown fox jumps over the lazy dog.",
    "don't I'll we're 12345 3.14159 v1.2.3-rc4",
    "def f(x):\n    return x * 2\n",
    "a  b   c    d\n\n\t end  ",
    "café naïve Straße 日本語のテキストです。 Привет 🙂👍🏽",
    "<|im_start|>user\nHi<|im_end|>\n<|endoftext|><file_sep>",
]


@pytest.fixture(scope="module")
def parsed_and_cached(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[Tokenizer, Tokenizer, int]]:
    """SmolLM2's tokenizer as parsed from the GGUF (the old path) and as read back from the
    cache, and how many times the GGUF was parsed for both (one)."""
    calls = []
    reader = gguf.GGUFReader

    def counting_reader(*args: Any, **kwargs: Any) -> Any:
        calls.append(args)
        return reader(*args, **kwargs)

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SERVEBENCH_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
        mp.setattr(gguf, "GGUFReader", counting_reader)
        cached_file = sources.tokenizer_cache_path(resolve_model_path("smollm2-135m"))
        assert cached_file is not None
        cached_file.parent.mkdir(parents=True)
        cached_file.write_text("{not json")  # a broken cache is parsed afresh and replaced
        parsed = load_tokenizer("smollm2-135m")
        assert json.loads(cached_file.read_text())["tokenizer_json"]
        cached = load_tokenizer("smollm2-135m")
        yield parsed, cached, len(calls)


def test_the_gguf_is_parsed_once_then_read_from_the_cache(
    parsed_and_cached: tuple[Tokenizer, Tokenizer, int],
) -> None:
    parsed, cached, parses = parsed_and_cached
    assert parses == 1
    assert cached is not parsed


def test_cached_tokenizer_encodes_and_decodes_like_the_parsed_one(
    parsed_and_cached: tuple[Tokenizer, Tokenizer, int],
) -> None:
    parsed, cached, _ = parsed_and_cached
    for attr in ("vocab_size", "eos_token_ids", "bos_token_id", "add_bos", "chat_template"):
        assert getattr(cached, attr) == getattr(parsed, attr), attr
    for text in TEXTS:
        for special in (True, False):
            assert cached.encode(text, special) == parsed.encode(text, special), text
    ids = list(range(parsed.vocab_size))
    assert [cached.decode([i]) for i in ids] == [parsed.decode([i]) for i in ids]
    assert [cached.decode([i], False) for i in ids] == [parsed.decode([i], False) for i in ids]
    rng = np.random.default_rng(0)
    for _ in range(20):
        seq = rng.integers(0, parsed.vocab_size, 50).tolist()
        assert cached.decode(seq) == parsed.decode(seq)
    messages = [{"role": "user", "content": "List five fruits that are red:"}]
    assert cached.encode_chat(messages) == parsed.encode_chat(messages)


def test_prompts_are_identical_with_the_cached_tokenizer_and_word_list(
    parsed_and_cached: tuple[Tokenizer, Tokenizer, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The old path (the GGUF parsed, the vocabulary scanned) and the new one (both read from
    the cache) build the same prompts for a seed."""
    parsed, cached, _ = parsed_and_cached
    uncached = copy.copy(parsed)
    uncached.derived_cache = None
    old = PromptBuilder(uncached)
    PromptBuilder(cached)  # scans once, writes the word list
    monkeypatch.setattr(workload, "word_tokens", lambda tk: pytest.fail("scanned again"))
    new = PromptBuilder(cached)
    assert new.words == old.words
    assert new.word_ids.tolist() == old.word_ids.tolist()
    cfg = WorkloadConfig("uniform:1:300", "16", shared_prefix_len=20, num_prefix_groups=2, seed=7)
    for a, b, _ in zip(synthetic(cfg, old), synthetic(cfg, new), range(50), strict=False):
        assert a == b


def test_cache_key_follows_the_file_and_the_cache_can_be_turned_off(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SERVEBENCH_CACHE_DIR", str(tmp_path / "c"))
    f = tmp_path / "m.gguf"
    f.write_bytes(b"x" * 10)
    first = sources.tokenizer_cache_path(f)
    assert first is not None and first.parent == tmp_path / "c" / "tokenizers"
    os.utime(f, ns=(0, 10**18))  # edited in place: same path, new mtime
    assert sources.tokenizer_cache_path(f) != first
    monkeypatch.setenv("SERVEBENCH_CACHE_DIR", "0")
    assert cache_dir() is None and sources.tokenizer_cache_path(f) is None
    monkeypatch.delenv("SERVEBENCH_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir() == tmp_path / "xdg" / "servebench"


def test_the_base_url_path_does_not_import_torch() -> None:
    """What `bench run --base-url` imports before its first request: torch alone is seconds
    of CPU, and nothing on that path needs it."""
    code = (
        "import sys\n"
        "import bench_cli.app, bench_cli.run.execute, bench_cli.tables, bench_cli.export\n"
        "from engine.config import engine_arg_names\n"
        "from engine.model.sources import ModelLoadError, load_tokenizer\n"
        "import loadgen.benchmark, loadgen.backends, loadgen.runner\n"
        "assert 'ttft' not in engine_arg_names() and 'max_num_seqs' in engine_arg_names()\n"
        "load_tokenizer('tiny-llama')\n"
        "print(sorted(m for m in ('torch', 'engine.engine', 'gguf') if m in sys.modules))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_generate_times_after_a_warm_up_and_flags_a_cold_compile(tmp_path: Path) -> None:
    """A machine's first `bench generate` compiled the CPU decode attention (inductor's cache
    was empty): its load time says so; the tok/s is timed after an untimed warm-up."""
    env = os.environ | {"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")}
    cmd = [sys.executable, "-m", "bench_cli", "generate", "Hi", "--model", "tiny-smollm2"]
    first, second = (
        subprocess.run(
            [*cmd, "--max-tokens", "3"], env=env, capture_output=True, text=True, check=True
        ).stdout
        for _ in range(2)
    )
    assert "(cold: includes compiling the CPU decode attention)" in first
    assert "cold" not in second
    assert "after a warm-up" in second
    assert "· 3 steps ·" in second  # the warm-up's steps are not counted


def test_a_fresh_unwarmed_bundled_engine_is_flagged_cold(
    tmp_path: Path, mock_server: Callable[..., str]
) -> None:
    from bench_cli.run.execute import execute

    small = {"num_requests": 3, "rate": 50.0, "warmup": 0, "input_len": "8", "output_len": "3"}
    runs = {
        "bundled": {"model": "tiny-smollm2", "in_process": True},
        "external": {"base_url": mock_server(), "model": "mock"},
    }
    for name, flags in runs.items():
        buf = io.StringIO()
        out = tmp_path / name
        rc = execute(
            "default",
            {**small, **flags, "out": str(out)},
            dashboard=False,
            console=Console(file=buf, width=200),
        )
        assert rc == 0, buf.getvalue()
        cold = json.loads((out / "summary.json").read_text())["cold_start"]
        assert cold is (name == "bundled")
        assert ("cold start" in buf.getvalue()) is (name == "bundled")
