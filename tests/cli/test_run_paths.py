"""Where a run writes: its name is one folder under results/, and --save-vllm-json never
writes over the run's own files nor, unless asked, over any file (issue 41 item 18)."""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from bench_cli.export import run_dir
from bench_cli.run.execute import execute
from bench_cli.sweep.options import SweepOptions
from bench_cli.sweep.runner import run_sweep

# A busy machine's schedule lag is not what these tests check (INVALID: test_run_lifecycle).
RUN = {"rate": 50.0, "num_requests": 3, "warmup": 0, "input_len": "8", "output_len": "3"}
RUN |= {"max_p99_lag_ms": 1000.0}


def bench_run(tmp_path: Path, **flags: Any) -> tuple[int, str]:
    buf = io.StringIO()
    flags = {**RUN, "base_url": "http://127.0.0.1:9/v1", "model": "m", **flags}
    rc = execute("default", flags, dashboard=False, console=Console(file=buf, width=200))
    return rc, buf.getvalue()


@pytest.mark.parametrize(
    "name", ["x/../../../elsewhere", "..", "a\\b", "", "a\x1b[2Jb", "n" * 201, "/abs"]
)
def test_a_name_that_is_not_one_folder_name_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match="give one folder name"):
        run_dir(None, name)
    assert not (tmp_path / "results").exists() or not any((tmp_path / "results").iterdir())


def test_a_run_named_with_a_path_writes_nothing_anywhere(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    work = tmp_path / "a" / "b"
    work.mkdir(parents=True)
    monkeypatch.chdir(work)
    rc, printed = bench_run(tmp_path, name="x/../../../elsewhere")
    assert rc == 2 and "give one folder name" in printed
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["a", "b"]
    run_dir(None, "ok-name.v2")  # an ordinary name still works
    assert [p.name.split("-", 2)[-1] for p in (work / "results").iterdir()] == ["ok-name.v2"]


@pytest.mark.parametrize("own", ["requests.jsonl", "summary.json", "config.json"])
def test_vllm_json_never_replaces_the_runs_own_files(tmp_path: Path, own: str) -> None:
    out = tmp_path / "run"
    rc, printed = bench_run(tmp_path, out=str(out), save_vllm_json=str(out / own))
    assert rc == 2 and f"this run's own {own}" in printed
    assert not out.exists()  # refused before anything


def test_vllm_json_replaces_a_file_only_when_asked(
    tmp_path: Path, mock_server: Callable[..., str]
) -> None:
    path = tmp_path / "result.json"
    path.write_text("an earlier hour's result\n")
    rc, printed = bench_run(tmp_path, out=str(tmp_path / "r1"), save_vllm_json=str(path))
    assert rc == 2 and "--overwrite-vllm-json" in printed
    assert path.read_text() == "an earlier hour's result\n" and not (tmp_path / "r1").exists()
    url = mock_server("--ttft", "0", "--itl", "0")
    flags = {"base_url": url, "save_vllm_json": str(path), "overwrite_vllm_json": True}
    rc, printed = bench_run(tmp_path, out=str(tmp_path / "r2"), **flags)
    assert rc == 0, printed
    assert json.loads(path.read_text())["completed"] == 3


def test_a_sweep_writes_one_vllm_json_a_point_in_its_folder(
    tmp_path: Path, mock_server: Callable[..., str]
) -> None:
    """A profile's save_vllm_json in a sweep: each point keeps its own file, none replaced."""

    url = mock_server("--ttft", "0", "--itl", "0")
    profile = tmp_path / "p.toml"
    profile.write_text(
        f'name = "v"\nbase_url = "{url}"\nmodel = "mock"\nnum_requests = 3\nwarmup = 0\n'
        f'input_len = "8"\noutput_len = "4"\nsave_vllm_json = "{tmp_path}/elsewhere/vllm.json"\n'
        "[sweep]\nrate = [5, 10]\n"
    )
    flags = {"base_url": None, "model": None, "api_key": None, "name": None}
    flags["out"] = str(tmp_path / "sweep")
    rc = run_sweep(str(profile), flags, SweepOptions(), Console(file=io.StringIO()))
    assert rc == 0
    written = sorted((tmp_path / "sweep").rglob("vllm.json"))
    assert len(written) == 2 and len({p.parent for p in written}) == 2
    assert not (tmp_path / "elsewhere").exists()
    assert all(json.loads(p.read_text())["completed"] == 3 for p in written)
