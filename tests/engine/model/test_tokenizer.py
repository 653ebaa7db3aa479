"""Our GGUF-built tokenizer against the Hugging Face one for SmolLM2: encoding, decoding,
incremental detokenization and the chat template."""

from __future__ import annotations

import os
import random
import unicodedata
from pathlib import Path
from typing import Any

import pytest
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import pre_tokenizers

from engine.model.loader import _read_gguf, resolve_model_path
from engine.model.tokenizer import IncrementalDetokenizer, Tokenizer, _gguf_pre_tokenizer

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # no network: transformers must not try the Hub

SPECIAL_TEXTS = ("<|im_start|>", "<|im_end|>", "<|endoftext|>", "<file_sep>", "<repo_name>")

HANDWRITTEN = [
    "",
    "Hello world",
    "Hello, world! How are you today?",
    "The quick brown fox jumps over the lazy dog.",
    "THE QUICK BROWN FOX",
    "tHe QuIcK bRoWn FoX",
    "CamelCaseIdentifier snake_case_name",
    "don't I'll we're they've she'd it's you'll I'm",
    "DON'T I'LL WE'RE",
    "'s 't 're",
    "12345",
    "3.14159",
    "1,000,000.00",
    "2024-01-31T12:34:56Z",
    "0x1F 0b1010 1e-9 -42 +7",
    "x   1",
    "a\n\n1",
    "   42",
    "x\t\t7",
    "price:  $  3.50",
    "x  \n 3",
    "v1.2.3-rc4",
    "phone: +1 (555) 123-4567",
    "99 bottles of beer",
    "١٢٣ ٤٥٦",
    "²³ ½ Ⅻ ①",
    "def f(x):\n    return x * 2\n",
    "def g(a, b):\n\tif a > b:\n\t\treturn a\n\treturn b\n",
    'fn main() {\n    let v: Vec<u32> = (0..10).collect();\n    println!("{:?}", v);\n}\n',
    '#include <stdio.h>\nint main(void) { printf("%d\\n", 42); return 0; }\n',
    "const x = async () => { await fetch('/api?q=1&r=2'); };",
    "SELECT id, name FROM users WHERE age >= 21 ORDER BY name;",
    "    indented four\n        indented eight\n\ttab\n\t\ttwo tabs",
    '<div class="a"><p>Hi &amp; bye</p></div>',
    "a  b   c    d     e",
    "          ",
    " ",
    "  ",
    "\n",
    "\n\n\n",
    "\t",
    "\r\n",
    " \n \n ",
    "  leading",
    "trailing  ",
    "\n\nleading newlines",
    "trailing newlines\n\n",
    " \t mixed \t ",
    "café naïve résumé Ångström façade",
    "Straße über Ärger",
    "ñandú pingüino",
    "日本語のテキストです。",
    "中文文本，标点符号。",
    "한국어 텍스트",
    "Привет, мир!",
    "Γειά σου κόσμε",
    "مرحبا بالعالم",
    "שלום עולם",
    "नमस्ते दुनिया",
    "สวัสดีชาวโลก",
    "😀",
    "👍🏽",
    "👨‍👩‍👧‍👦 family",
    "🇫🇷🇯🇵",
    "I ❤️ Python 🐍!",
    "emoji😀between😀words",
    "e\u0301 a\u0300 o\u0308 n\u0303",
    "Z\u0335\u0321a\u0336l\u0337g\u0338o",
    "zero\u200bwidth\u200cnon\u200djoiner\ufeffbom",
    "soft\u00adhyphen",
    "nbsp\u00a0here",
    "\u2028line sep\u2029para sep",
    "replacement \ufffd char",
    "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n",
    "text <|im_end|> more text",
    "<|endoftext|><|endoftext|>",
    "a<|im_start|>b",
    "<|im_start",
    "im_start|>",
    "<|im_end|",
    "< |im_end| >",
    "<file_sep>path/to/file.py",
    "https://example.com/path?query=1&other=two#frag",
    "http://localhost:8080/v1/completions",
    "mailto:someone@example.org",
    "C:\\Users\\name\\file.txt",
    "/usr/local/bin/python3.11",
    '{"key": "value", "n": [1, 2.5, -3e4], "nested": {"ok": true, "none": null}}',
    '[{"a":1},{"b":"c\\nd"}]',
    "a" * 300,
    "supercalifragilisticexpialidocious" * 12,
    "Pneumonoultramicroscopicsilicovolcanoconiosis",
    "x" * 1000 + " " + "y" * 1000,
    "0123456789" * 30,
    "!!!???...,,,;;;:::---___===+++",
    "~`@#$%^&*()[]{}<>|\\/",
]

FRAGMENTS = [
    "hello",
    "World",
    "don't",
    "I'll",
    "12345",
    "3.14159",
    "007",
    "  ",
    "\t",
    "\n",
    "\n\n",
    "    ",
    "def",
    "return x",
    "{",
    "}",
    "()",
    "=>",
    "<|im_start|>",
    "<|im_end|>",
    "café",
    "日本",
    "😀",
    "👍🏽",
    "مرحبا",
    "e\u0301",
    "\u200b",
    "https://a.b/c?d=1",
    '{"k": 1}',
    "UPPER",
    "lower",
    "MiXeD",
    "a" * 40,
    "!!",
    "...",
    "ß",
    "€100",
    "½",
    "\r\n",
    " x ",
]
SEPARATORS = ["", " ", "  ", "\n", "\t", " \n", "\r\n"]
CODEPOINT_RANGES = [
    (0x20, 0x7E),
    (0xA0, 0x17F),
    (0x370, 0x3FF),
    (0x400, 0x4FF),
    (0x590, 0x6FF),
    (0x900, 0x97F),
    (0x300, 0x36F),
    (0x3040, 0x30FF),
    (0x4E00, 0x4FFF),
    (0xAC00, 0xAD00),
    (0x1F300, 0x1F64F),
    (0x2000, 0x206F),
    (0xFF00, 0xFFEF),
]


def _corpus() -> list[str]:
    rng = random.Random(1234)
    texts = list(HANDWRITTEN)
    for _ in range(200):  # fragment soups: the boundaries between kinds of text
        parts = rng.choices(FRAGMENTS, k=rng.randint(1, 7))
        seps = rng.choices(SEPARATORS, k=len(parts))
        texts.append("".join(p + s for p, s in zip(parts, seps, strict=True)))
    for _ in range(100):  # random code points from many scripts, spaces and digits included
        lo, hi = rng.choice(CODEPOINT_RANGES)
        texts.append("".join(chr(rng.randint(lo, hi)) for _ in range(rng.randint(1, 40))))
    return texts


TEXTS = _corpus()


def _has_number(text: str) -> bool:
    return any(unicodedata.category(c).startswith("N") for c in text)


@pytest.fixture(scope="module")
def gguf_path() -> Path:
    return resolve_model_path("smollm2-135m")


@pytest.fixture(scope="module")
def tok(gguf_path: Path) -> Tokenizer:
    _cfg, weights, tokenizer = _read_gguf(gguf_path)
    weights.close()  # lazy: nothing was dequantized
    return tokenizer


@pytest.fixture(scope="module")
def ref(gguf_path: Path) -> Any:
    transformers = pytest.importorskip("transformers")
    return transformers.AutoTokenizer.from_pretrained(
        str(gguf_path.parent), gguf_file=gguf_path.name
    )


@pytest.fixture(scope="module")
def original_ref(ref: Any) -> HFTokenizer:
    """The reference with the pre-tokenizer of SmolLM2's own tokenizer.json (Digits with
    individual_digits=True, then ByteLevel), which transformers' GGUF converter drops; llama.cpp's
    'smollm' pre-tokenizer also isolates every \\p{N} before the GPT-2 regex."""
    backend = HFTokenizer.from_str(ref.backend_tokenizer.to_str())
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True),
        ]
    )
    return backend


def test_corpus_is_large_and_varied() -> None:
    assert len(TEXTS) >= 300
    assert len(set(TEXTS)) >= 290
    assert sum(not _has_number(t) for t in TEXTS) >= 150


def test_encode_matches_original_smollm2_tokenizer(
    tok: Tokenizer, original_ref: HFTokenizer
) -> None:
    mismatches = [
        (t, ours, theirs)
        for t in TEXTS
        if (ours := tok.encode(t))
        != (theirs := original_ref.encode(t, add_special_tokens=True).ids)
    ]
    assert not mismatches, f"{len(mismatches)} texts differ, e.g. {mismatches[:3]}"


def test_encode_matches_transformers_gguf_tokenizer_on_text_without_numbers(
    tok: Tokenizer, ref: Any
) -> None:
    # With numbers, transformers' GGUF tokenizer (no Digits pre-tokenizer) splits whitespace
    # before a digit differently from SmolLM2's tokenizer.json and llama.cpp; see above.
    mismatches = [
        (t, ours, theirs)
        for t in TEXTS
        if not _has_number(t)
        and (ours := tok.encode(t)) != (theirs := ref(t, add_special_tokens=True).input_ids)
    ]
    assert not mismatches, f"{len(mismatches)} texts differ, e.g. {mismatches[:3]}"


def test_whitespace_run_before_digit_is_one_token(tok: Tokenizer) -> None:
    # "x   1" -> "x", "   ", "1" (Digits isolates "1" first); without it "  ", " 1" -> 4 tokens.
    ids = tok.encode("x   1")
    assert [tok.token_to_str(i) for i in ids] == ["x", "ĠĠĠ", "1"]


@pytest.mark.parametrize(
    ("pre", "pieces"),
    [
        ("smollm", ["x", "ĠĠĠ", "1", "2", "3", "4", "Ġdon", "'t", "ĊĊ", "7"]),
        ("starcoder", ["x", "ĠĠĠ", "1", "2", "3", "4", "Ġdon", "'t", "ĊĊ", "7"]),
        ("gpt2", ["x", "ĠĠ", "Ġ1234", "Ġdon", "'t", "Ċ", "Ċ", "7"]),
        ("llama3", ["x", "ĠĠ", "Ġ", "123", "4", "Ġdon", "'t", "ĊĊ", "7"]),
    ],
)
def test_gguf_pre_tokenizer_splits_like_llama_cpp(pre: str, pieces: list[str]) -> None:
    # llama.cpp (llama-vocab.cpp): smollm and starcoder share the regexes {"\p{N}", GPT-2's}.
    got = [p for p, _ in _gguf_pre_tokenizer(pre).pre_tokenize_str("x   1234 don't\n\n7")]
    assert got == pieces


def test_special_token_ids_and_vocab_match_reference(tok: Tokenizer, ref: Any) -> None:
    assert tok.vocab_size == len(ref) == 49152
    assert tok.eos_token_ids == (ref.eos_token_id,) == (2,)
    assert tok.bos_token_id == ref.bos_token_id == 1
    assert not tok.add_bos


@pytest.mark.parametrize("special", SPECIAL_TEXTS)
def test_special_token_text_is_one_id(tok: Tokenizer, ref: Any, special: str) -> None:
    (token_id,) = tok.encode(special)
    assert token_id == ref.convert_tokens_to_ids(special)
    ids = tok.encode(f"before {special} after")
    assert ids.count(token_id) == 1
    assert tok.token_to_str(token_id) == special


def test_decode_skips_special_tokens(tok: Tokenizer) -> None:
    ids = tok.encode("<|im_start|>user\nHi there<|im_end|>\n<|endoftext|>")
    assert tok.decode(ids) == "user\nHi there\n"
    assert tok.decode(ids, skip_special_tokens=False) == (
        "<|im_start|>user\nHi there<|im_end|>\n<|endoftext|>"
    )
    assert tok.decode([2]) == ""


def test_decode_inverts_encode(tok: Tokenizer) -> None:
    for text in TEXTS:
        ids = tok.encode(text)
        assert tok.decode(ids, skip_special_tokens=False) == text
        without_special = text
        for special in SPECIAL_TEXTS:
            without_special = without_special.replace(special, "")
        assert tok.decode(ids) == without_special


def _stream(tok: Tokenizer, prompt_ids: list[int], output_ids: list[int]) -> list[str]:
    """Feed output tokens one at a time, as the engine does, then flush."""
    detok = IncrementalDetokenizer(tok, prompt_ids)
    all_ids = list(prompt_ids)
    deltas = []
    for token in output_ids:
        all_ids.append(token)
        deltas.append(detok.step(all_ids))
    deltas.append(detok.step(all_ids, final=True))
    return deltas


STREAM_CASES = [
    ("Hello", " world, how are you?"),
    ("Tell me a joke 😀", " Sure 😀😀! 👨‍👩‍👧‍👦 🇫🇷 done"),
    ("日本語", "のテキスト、中文 한국어"),
    ("emoji at the end", " 👍🏽"),
    ("x", "😀"),
    ("code:", "\n    def f():\n\treturn 'é'\n"),
    ("chat", "<|im_start|>assistant\nHi<|im_end|> after"),
    ("e", "\u0301 combining \u200b zero-width"),
]


@pytest.mark.parametrize(("prompt", "output"), STREAM_CASES)
def test_incremental_detokenizer_concatenates_to_full_decode(
    tok: Tokenizer, prompt: str, output: str
) -> None:
    prompt_ids, output_ids = tok.encode(prompt), tok.encode(output)
    deltas = _stream(tok, prompt_ids, output_ids)
    assert "".join(deltas) == tok.decode(output_ids)


def test_incremental_detokenizer_holds_back_partial_characters(tok: Tokenizer) -> None:
    output_ids = tok.encode(" 😀 👍🏽 🎉")
    assert len(output_ids) > 6  # the emoji are split into byte tokens
    deltas = _stream(tok, tok.encode("Say it:"), output_ids)
    assert all("\ufffd" not in d for d in deltas)
    assert "".join(deltas) == " 😀 👍🏽 🎉"


def test_incremental_detokenizer_on_random_ids_matches_full_decode(tok: Tokenizer) -> None:
    # Any model output, including byte tokens that never form valid UTF-8 and special tokens.
    rng = random.Random(7)
    prompt_ids = tok.encode("A prompt 😀")
    for _ in range(50):
        output_ids = [rng.randrange(tok.vocab_size) for _ in range(rng.randint(1, 20))]
        output_ids += rng.choices(range(100, 400), k=rng.randint(0, 6))  # many byte tokens
        deltas = _stream(tok, prompt_ids, output_ids)
        assert "".join(deltas) == tok.decode(output_ids), output_ids


CONVERSATIONS = [
    [{"role": "user", "content": "Hello!"}],
    [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "What is 2+2?"},
    ],
    [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello! How can I help?"},
        {"role": "user", "content": "Write a haiku about  spaces\nand newlines. 😀"},
    ],
    [
        {"role": "system", "content": ""},
        {"role": "user", "content": "  leading and trailing  "},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": "日本語で答えて"},
    ],
]


@pytest.mark.parametrize("messages", CONVERSATIONS)
def test_chat_template_matches_reference(
    tok: Tokenizer, ref: Any, messages: list[dict[str, str]]
) -> None:
    ours = tok.apply_chat_template(messages, add_generation_prompt=True)
    theirs = ref.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert ours == theirs
    assert ours.endswith("<|im_start|>assistant\n")
    ours_no_prompt = tok.apply_chat_template(messages, add_generation_prompt=False)
    theirs_no_prompt = ref.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=False
    )
    assert ours_no_prompt == theirs_no_prompt


def test_chat_template_adds_default_system_message_only_when_missing(tok: Tokenizer) -> None:
    without = tok.apply_chat_template([{"role": "user", "content": "Hi"}])
    with_system = tok.apply_chat_template(
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    )
    assert without.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
    assert with_system.startswith("<|im_start|>system\nBe brief.<|im_end|>\n")
    assert with_system.count("<|im_start|>system") == 1


def bos_template_tokenizer(tok: Tokenizer) -> Tokenizer:
    """SmolLM2's tokenizer as a Llama-3-style model has it: BOS added to plain prompts, and a
    chat template that writes `{{ bos_token }}` itself."""
    assert tok.chat_template is not None
    bos = tok.eos_token_ids[0]  # any special token will do as this model's BOS
    return Tokenizer(
        tok.tokenizer, tok.eos_token_ids, bos, True, "{{ bos_token }}" + tok.chat_template
    )


def test_a_chat_template_that_writes_bos_gets_exactly_one(tok: Tokenizer) -> None:
    bos_tok = bos_template_tokenizer(tok)
    messages = [{"role": "user", "content": "Hi"}]
    ids = bos_tok.encode_chat(messages)
    bos = bos_tok.bos_token_id
    assert ids[0] == bos and ids[1] != bos
    assert ids == [bos, *tok.encode_chat(messages)]
    assert bos_tok.encode("Hi")[0] == bos  # plain prompts still get theirs
