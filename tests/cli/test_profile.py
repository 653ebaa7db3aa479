"""`bench profile`: steps of the asked shape, time by category that adds up to the step, a
trace Perfetto can open, and a clear refusal when the engine cannot run the shape."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

from bench_cli.app import app
from bench_cli.profile.capture import CATEGORIES, COMPILED_REST, FORWARD_REST, SCOPE, ops_seconds

runner = CliRunner()


def _profile(tmp_path: Path, *args: str) -> tuple[dict, str]:
    out = tmp_path / "p"
    base = ["profile", "--model", "tiny-llama", "--steps", "3", "--warmup", "1", "--out", str(out)]
    result = runner.invoke(app, [*base, *args])
    assert result.exit_code == 0, result.output
    return json.loads((out / "profile.json").read_text()), result.output


def _trace_names(report: dict) -> set[str]:
    events = json.loads(Path(report["trace"]).read_text())["traceEvents"]
    return {e["name"] for e in events if e.get("ph") == "X"}


@pytest.mark.serial  # profiled op times against the timed step
def test_the_compiled_forward_is_split_into_linears_and_the_fused_rest(tmp_path: Path) -> None:
    report, output = _profile(tmp_path, "--batch", "3", "--context", "20")
    assert report["shape"]["batch"] == 3 and report["engine"]["enforce_eager"] is False
    took = report["category_s"]
    assert set(took) == set(CATEGORIES)
    assert took["linears"] > 0 and took[COMPILED_REST] > 0 and took["LM head"] > 0
    assert took["attention"] == 0 and took[FORWARD_REST] == 0  # inside the compiled graph
    for category in ("sampling", "scheduling", "input preparation"):
        assert took[category] > 0
    # The categories are exclusive: they add up to the timed step, not more.
    assert sum(took.values()) == pytest.approx(report["timed_step_s"], rel=0.5)
    # 3 decodes at ~20-25 tokens: attention reads that context, and each step samples 3 rows.
    rates = report["analysis"]["rates"]
    assert rates["LM head"]["flops"] == 2 * 64 * 512 * 3  # tiny-llama: hidden 64, vocab 512
    assert report["decode_context"] >= 3 * 21
    names = _trace_names(report)
    assert SCOPE + COMPILED_REST in names and "servebench::linear" in names
    for text in ("linears", "memory floor", "peaks measured now", "trace:", "GB/s"):
        assert text in output


def test_the_eager_path_with_a_prefill_chunk_times_every_layer_part(tmp_path: Path) -> None:
    report, _ = _profile(
        tmp_path, "--batch", "2", "--context", "20", "--prefill", "8", "--enforce-eager"
    )
    took = report["category_s"]
    for category in ("linears", "attention", FORWARD_REST, "LM head"):
        assert took[category] > 0, category
    assert took[COMPILED_REST] == 0
    assert report["prefill_start"] > 0  # each step's chunk continues the prompt
    # Linear FLOPs count every token of the step: 2 decodes + 8 prefill.
    cfg_params = report["analysis"]["rates"]["linears"]["flops"] / (2 * 10)
    assert cfg_params == int(cfg_params) and cfg_params > 0
    names = _trace_names(report)
    assert {SCOPE + "attention", SCOPE + "linears", SCOPE + "LM head"} <= names


def test_a_shape_the_engine_cannot_run_is_refused(tmp_path: Path) -> None:
    out = tmp_path / "p"
    args = ["profile", "--model", "tiny-llama", "--batch", "4", "--context", "40"]
    result = runner.invoke(app, [*args, "--num-kv-blocks", "6", "--out", str(out)])
    assert result.exit_code == 2
    assert "bench profile:" in result.output and "not 4 decodes" in result.output


def test_a_step_of_nothing_is_refused(tmp_path: Path) -> None:
    result = runner.invoke(app, ["profile", "--model", "tiny-llama", "--batch", "0"])
    assert result.exit_code == 2 and "needs a decode" in result.output


def _event(name: str, us: float, parent: SimpleNamespace | None = None) -> SimpleNamespace:
    return SimpleNamespace(
        name=name, cpu_parent=parent, time_range=SimpleNamespace(elapsed_us=lambda: us)
    )


def test_ops_are_counted_once_under_the_category_that_called_them() -> None:
    fwd = _event(SCOPE + COMPILED_REST, 1000)
    region = _event("Torch-Compiled Region", 900, fwd)
    op = _event("servebench::packed_linear", 500, region)
    inner = _event("mkldnn::_linear_pointwise", 480, op)  # inside the op: not counted again
    head = _event(SCOPE + "LM head", 200)
    head_op = _event("mkldnn::_linear_pointwise", 150, head)
    direct, linear = ops_seconds([fwd, region, op, inner, head, head_op])
    assert direct == pytest.approx({COMPILED_REST: 900e-6, "LM head": 150e-6})
    assert linear == pytest.approx({COMPILED_REST: 500e-6, "LM head": 150e-6})


def test_compare_shows_an_earlier_profile_beside_and_warns_of_other_differences(
    tmp_path: Path,
) -> None:
    before, _ = _profile(tmp_path / "a", "--batch", "2", "--context", "20", "--enforce-eager")
    out = tmp_path / "b"
    args = ["profile", "--model", "tiny-llama", "--steps", "3", "--warmup", "1"]
    result = runner.invoke(
        app,
        [
            *args,
            "--batch",
            "2",
            "--context",
            "24",
            "--out",
            str(out),
            "--compare",
            str(tmp_path / "a" / "p"),
        ],
    )
    assert result.exit_code == 0, result.output
    assert "before ms/step" in result.output and "as fast" in result.output
    # Eager before, compiled now: both paths' categories are rows; the other differences said.
    assert "attention" in result.output and "compiled layers" in result.output
    assert "context: 20 before, 24 now" in result.output
    assert "enforce_eager: True before, False now" in result.output
    assert before["shape"]["context"] == 20


def test_compare_with_no_profile_there_fails_before_running(tmp_path: Path) -> None:
    args = ["profile", "--model", "tiny-llama", "--compare", str(tmp_path / "none")]
    result = runner.invoke(app, [*args, "--out", str(tmp_path / "p")])
    assert result.exit_code == 2 and "cannot read a profile" in result.output
    assert not (tmp_path / "p").exists()
