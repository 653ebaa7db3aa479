"""Trace readers: the three public formats and our JSONL read into relative seconds and token
counts; every malformed input names its file, line and field."""

from __future__ import annotations

from pathlib import Path

import pytest

from loadgen.traces import TRACE_FORMATS, Trace, TraceError, read_trace

DATA = Path(__file__).parents[1] / "data"
MOONCAKE = DATA / "mooncake_sample.jsonl"
AZURE = DATA / "azure_sample.csv"
BURSTGPT = DATA / "burstgpt_sample.csv"


def assert_relative_and_ordered(trace: Trace) -> None:
    times = [row.timestamp_s for row in trace.rows]
    assert times[0] == 0.0
    assert times == sorted(times)


# ---- the samples ------------------------------------------------------------------------------


def test_mooncake_sample_reads_ms_as_seconds_with_hash_ids() -> None:
    trace = read_trace(MOONCAKE, "mooncake")
    assert (trace.format, trace.path, len(trace.rows)) == ("mooncake", str(MOONCAKE), 14)
    assert_relative_and_ordered(trace)
    first, third, last = trace.rows[0], trace.rows[2], trace.rows[-1]
    assert (first.input_len, first.output_len, first.hash_ids) == (1843, 212, (0, 1, 2, 3))
    assert third.timestamp_s == pytest.approx(1.027)
    assert third.line == 3
    assert last.timestamp_s == pytest.approx(17.342)
    assert all(len(row.hash_ids) == -(-row.input_len // 512) for row in trace.rows)
    assert sum(row.hash_ids[:3] == (0, 1, 2) for row in trace.rows) >= 5  # a shared prefix


def test_azure_sample_reads_datetimes_as_seconds_with_sub_second_precision() -> None:
    trace = read_trace(AZURE, "azure")
    assert len(trace.rows) == 14
    assert_relative_and_ordered(trace)
    assert trace.rows[1].timestamp_s == pytest.approx(4.314579, abs=1e-6)
    assert trace.rows[3].timestamp_s == trace.rows[4].timestamp_s  # same arrival time
    assert trace.rows[-1].timestamp_s == pytest.approx(25.4066, abs=1e-6)
    assert (trace.rows[0].input_len, trace.rows[0].output_len, trace.rows[0].line) == (1748, 19, 2)
    assert all(row.hash_ids == () for row in trace.rows)


def test_azure_accepts_a_timezone_suffix_and_whole_seconds(tmp_path: Path) -> None:
    path = tmp_path / "azure_2024.csv"
    path.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2024-05-10 00:00:00+00:00,400,30\n"
        "2024-05-10 00:00:01.0110000+00:00,512,12\n"
        "2024-05-10 02:00:01.5+02:00,90,7\n"  # the same instant as 00:00:01.5 UTC
    )
    times = [row.timestamp_s for row in read_trace(path, "azure").rows]
    assert times == pytest.approx([0.0, 1.011, 1.5], abs=1e-6)


def test_burstgpt_sample_skips_failed_rows() -> None:
    trace = read_trace(BURSTGPT, "burstgpt")
    assert (len(trace.rows), trace.skipped_failed, trace.skipped_model) == (14, 2, 0)
    assert_relative_and_ordered(trace)
    assert trace.rows[1].timestamp_s == 40.0
    assert all(row.output_len > 0 for row in trace.rows)


@pytest.mark.parametrize(
    ("model", "kept", "failed", "other_models", "first_line", "last_s"),
    [("ChatGPT", 9, 1, 6, 2, 557.0), ("GPT-4", 5, 1, 10, 6, 380.0)],
)
def test_burstgpt_model_filter_keeps_one_model(
    model: str, kept: int, failed: int, other_models: int, first_line: int, last_s: float
) -> None:
    trace = read_trace(BURSTGPT, "burstgpt", model=model)
    assert (len(trace.rows), trace.skipped_failed, trace.skipped_model) == (
        kept,
        failed,
        other_models,
    )
    assert_relative_and_ordered(trace)
    assert trace.rows[0].line == first_line  # timestamps count from the first kept row
    assert trace.rows[-1].timestamp_s == last_s


def test_jsonl_reads_seconds_and_optional_hash_ids(tmp_path: Path) -> None:
    path = tmp_path / "ours.jsonl"
    path.write_text(
        '{"timestamp": 10.5, "input_len": 100, "output_len": 20}\n'
        "\n"
        '{"timestamp": 11.25, "input_len": 300, "output_len": 1, "hash_ids": [7, 8]}\n'
    )
    trace = read_trace(path, "jsonl")
    assert [(r.timestamp_s, r.input_len, r.output_len, r.hash_ids, r.line) for r in trace.rows] == [
        (0.0, 100, 20, (), 1),
        (0.75, 300, 1, (7, 8), 3),
    ]


def test_trace_error_is_a_value_error() -> None:
    assert issubclass(TraceError, ValueError)
    assert TRACE_FORMATS == ("mooncake", "azure", "burstgpt", "jsonl")


# ---- malformed traces --------------------------------------------------------------------------

MOONCAKE_OK = '{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [0, 1]}\n'
AZURE_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
AZURE_OK = "2023-11-16 18:15:46.6805900,1748,19\n"
BURSTGPT_HEADER = "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
BURSTGPT_OK = "5,ChatGPT,472,18,490,Conversation log\n"
JSONL_OK = '{"timestamp": 1.0, "input_len": 10, "output_len": 2}\n'

MALFORMED = [
    # (format, file name, content, line, what the message must say)
    ("mooncake", "bad_json.jsonl", MOONCAKE_OK + '{"timestamp": 5, "input_len\n', 2, "bad JSON"),
    ("jsonl", "not_object.jsonl", JSONL_OK + "[1, 2]\n", 2, "not a JSON object"),
    # a cut line once said "(column 1)"; a wrong character names its own column
    ("jsonl", "cut.jsonl", JSONL_OK + '{"timestamp": 2, "input_len": 5\n', 2, "(the line ends"),
    ("jsonl", "comma.jsonl", JSONL_OK + '{"timestamp": 2,, "input_len": 5}\n', 2, "(column 17)"),
    (
        "jsonl",
        "missing_key.jsonl",
        JSONL_OK + "\n" + JSONL_OK + '{"timestamp": 2.0, "input_len": 10}\n',
        4,  # the blank line 2 still counts
        "missing 'output_len'",
    ),
    ("azure", "not_int.csv", AZURE_HEADER + AZURE_OK + "2023-11-16 18:15:47,abc,3\n", 3,
     "'ContextTokens' is not an integer: 'abc'"),
    ("azure", "fraction.csv", AZURE_HEADER + "2023-11-16 18:15:47,12.5,3\n", 2,
     "'ContextTokens' is not an integer: '12.5'"),
    ("azure", "zero_output.csv", AZURE_HEADER + "2023-11-16 18:15:47,12,0\n", 2,
     "'GeneratedTokens' must be at least 1: 0"),
    ("azure", "short_row.csv", AZURE_HEADER + AZURE_OK + "2023-11-16 18:15:47,12\n", 3,
     "missing 'GeneratedTokens'"),
    ("burstgpt", "negative.csv", BURSTGPT_HEADER + BURSTGPT_OK + "9,GPT-4,-4,10,6,API log\n", 3,
     "'Request tokens' must be at least 1: -4"),
    ("burstgpt", "neg_resp.csv", BURSTGPT_HEADER + "9,GPT-4,4,-1,3,API log\n", 2,
     "'Response tokens' must be at least 0: -1"),
    ("burstgpt", "bad_time.csv", BURSTGPT_HEADER + "soon,GPT-4,4,1,5,API log\n", 2,
     "'Timestamp' is not a number: 'soon'"),
    ("burstgpt", "unsorted.csv", BURSTGPT_HEADER + BURSTGPT_OK * 2 + "4,GPT-4,4,1,5,API log\n", 4,
     "'Timestamp' is earlier than line 3's"),
    (
        "mooncake",
        "unsorted.jsonl",
        MOONCAKE_OK.replace('"timestamp": 0', '"timestamp": 900') * 2 + MOONCAKE_OK,
        3,
        "'timestamp' is earlier than line 2's",
    ),
    ("mooncake", "hash_count.jsonl", MOONCAKE_OK + MOONCAKE_OK.replace("[0, 1]", "[0, 1, 2]"), 2,
     "'hash_ids' has 3 ids, 'input_length' 600 needs 2"),
    ("mooncake", "hash_type.jsonl", MOONCAKE_OK.replace("[0, 1]", '[0, "1"]'), 1,
     "'hash_ids' is not a list of integers"),
    ("mooncake", "no_hash.jsonl", MOONCAKE_OK.replace(', "hash_ids": [0, 1]', ""), 1,
     "missing 'hash_ids'"),
    ("azure", "no_column.csv", "TIMESTAMP,ContextTokens\n2023-11-16 18:15:47,12\n", 1,
     "header lacks 'GeneratedTokens'"),
    ("burstgpt", "no_column.csv", "Timestamp,Request tokens,Response tokens\n5,1,1\n", 1,
     "header lacks 'Model'"),
    ("azure", "bad_datetime.csv", AZURE_HEADER + AZURE_OK + "16/11/2023 18:15,12,3\n", 3,
     "'TIMESTAMP' is not a date-time: '16/11/2023 18:15'"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("fmt", "name", "content", "line", "what"), MALFORMED, ids=[case[1] for case in MALFORMED]
)
def test_malformed_trace_names_file_line_and_field(
    tmp_path: Path, fmt: str, name: str, content: str, line: int, what: str
) -> None:
    path = tmp_path / name
    path.write_text(content)
    with pytest.raises(TraceError) as error:
        read_trace(path, fmt)
    assert f"trace {path}, line {line}: " in str(error.value)
    assert what in str(error.value)


def test_unknown_format_lists_the_formats() -> None:
    with pytest.raises(TraceError, match=r"'sharegpt'.*mooncake, azure, burstgpt, jsonl"):
        read_trace(MOONCAKE, "sharegpt")


def test_missing_file_names_the_path(tmp_path: Path) -> None:
    path = tmp_path / "nowhere.jsonl"
    with pytest.raises(TraceError, match=r"nowhere\.jsonl: no such file"):
        read_trace(path, "jsonl")


@pytest.mark.parametrize(
    ("fmt", "content"),
    [("jsonl", ""), ("mooncake", "\n\n"), ("azure", ""), ("azure", AZURE_HEADER)],
    ids=["jsonl-empty", "mooncake-blank-lines", "azure-empty", "azure-header-only"],
)
def test_empty_trace_is_an_error(tmp_path: Path, fmt: str, content: str) -> None:
    path = tmp_path / "empty.txt"
    path.write_text(content)
    with pytest.raises(TraceError, match=r"empty\.txt: no requests"):
        read_trace(path, fmt)


def test_trace_whose_rows_are_all_skipped_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "all_failed.csv"
    path.write_text(BURSTGPT_HEADER + "5,ChatGPT,10,0,10,API log\n6,GPT-4,10,3,13,API log\n")
    with pytest.raises(TraceError, match=r"no requests \(1 failed, 1 of other models\)"):
        read_trace(path, "burstgpt", model="ChatGPT")


def test_model_filter_on_another_format_is_an_error() -> None:
    with pytest.raises(TraceError, match="burstgpt"):
        read_trace(AZURE, "azure", model="GPT-4")


def test_an_output_len_flag_replaces_the_traces_output_lengths() -> None:
    """Before, `--output-len` with a trace was recorded in config.json and not used."""
    from engine.model.loader import load_tokenizer
    from loadgen.traces import Trace, TraceRow
    from loadgen.workload import PromptBuilder, from_trace

    trace = Trace([TraceRow(0.1 * i, 8 + i, 100 + i) for i in range(4)])
    builder = PromptBuilder(load_tokenizer("smollm2-135m"))
    own = from_trace(trace, builder, seed=0)
    fixed = from_trace(trace, builder, seed=0, output_len="7")
    assert [s.output_len for s in own] == [100, 101, 102, 103]
    assert [s.output_len for s in fixed] == [7] * 4
    assert [s.prompt for s in fixed] == [s.prompt for s in own]  # the same prompts
