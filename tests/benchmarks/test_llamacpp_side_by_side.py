"""benchmarks/llamacpp_side_by_side.py without llama.cpp: reading llama-batched-bench's table
(a captured run of it, tests/data/llama_batched_bench_sample.txt), and the medians and
ratios printed from the rounds."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import llamacpp_side_by_side as bench  # noqa: E402
import llamacpp_tools as tools  # noqa: E402

SAMPLE = (ROOT / "tests" / "data" / "llama_batched_bench_sample.txt").read_text()


def test_table_rows_are_read_by_their_header() -> None:
    rows = tools.parse_batched_bench(SAMPLE)
    assert [(r["pp"], r["tg"], r["b"]) for r in rows] == [(128, 64, 8)]
    (row,) = rows
    assert row["n_kv"] == 8 * (128 + 64)
    assert row["t_tg_s"] == pytest.approx(8 * 64 / row["tg_tok_s"], rel=0.01)


def test_decode_tok_s_is_the_s_tg_column() -> None:
    rows = tools.parse_batched_bench(SAMPLE)
    assert tools.decode_tok_s(rows, 128, 64, 8) == rows[0]["tg_tok_s"]


def test_a_shape_batched_bench_skipped_is_an_error() -> None:
    rows = tools.parse_batched_bench(SAMPLE)
    with pytest.raises(LookupError, match="B=32"):
        tools.decode_tok_s(rows, 128, 64, 32)


def test_columns_are_found_by_name_not_position() -> None:
    lines = [
        "|  S_TG t/s |  B |  TG |  PP | T_TG s |",
        "|-----------|----|-----|-----|--------|",
        "|    200.00 |  4 |  10 |  16 |  0.200 |",
    ]
    (row,) = tools.parse_batched_bench("\n".join(lines))
    assert (row["pp"], row["tg"], row["b"], row["tg_tok_s"]) == (16, 10, 4, 200.0)
    assert tools.decode_tok_s([row], 16, 10, 4) == 200.0


def test_s_tg_that_disagrees_with_its_time_is_refused() -> None:
    row = {"pp": 16, "tg": 10, "b": 4, "t_tg_s": 0.4, "tg_tok_s": 200.0}  # 4*10/0.4 = 100
    with pytest.raises(ValueError, match="disagrees"):
        tools.decode_tok_s([row], 16, 10, 4)


def test_output_without_a_table_is_refused() -> None:
    with pytest.raises(ValueError, match="no llama-batched-bench table"):
        tools.parse_batched_bench("error: failed to load model\n")


def test_settings_line_is_read() -> None:
    settings = tools.bench_settings(SAMPLE)
    assert settings["n_threads"] == 2
    assert settings["n_kv_max"] >= 8 * (128 + 64)
    assert "flash_attn" in settings


def rounds(dtype: str, batch: int, ours: list[float], theirs: list[float]) -> list[dict]:
    return [
        {"dtype": dtype, "batch": batch, "round": i + 1, "ours_tok_s": a, "llamacpp_tok_s": b}
        for i, (a, b) in enumerate(zip(ours, theirs, strict=True))
    ]


def test_summary_gives_medians_and_their_ratio_per_dtype_and_batch() -> None:
    records = rounds("bfloat16", 1, [80.0, 40.0, 82.0], [81.0, 79.0, 20.0])
    records += rounds("float32", 8, [300.0, 330.0, 310.0], [100.0, 110.0, 105.0])
    s1, s8 = bench.summarize(records)
    assert (s1["dtype"], s1["batch"], s1["rounds"]) == ("bfloat16", 1, 3)
    assert (s1["ours_median"], s1["llamacpp_median"]) == (80.0, 79.0)
    assert s1["ratio"] == pytest.approx(80.0 / 79.0)  # of the medians, not a median of ratios
    assert s1["ratio_min"] == pytest.approx(40.0 / 79.0)
    assert s1["ratio_max"] == pytest.approx(82.0 / 20.0)
    assert s8["ratio"] == pytest.approx(310.0 / 105.0)


def test_summary_keeps_the_order_rounds_came_in() -> None:
    records = []
    for r in range(2):  # rounds interleave dtypes and batches
        for dtype, batch in (("float32", 32), ("float32", 1), ("bfloat16", 8)):
            records += rounds(dtype, batch, [10.0 + r], [5.0])
    got = [(s["dtype"], s["batch"], s["ours_tok_s"]) for s in bench.summarize(records)]
    assert got == [("float32", 32, [10.0, 11.0]), ("float32", 1, [10.0, 11.0]),
                   ("bfloat16", 8, [10.0, 11.0])]  # fmt: skip
