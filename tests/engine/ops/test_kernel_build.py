"""The CPU kernels' build: one folder per source, a lock that times out and says why, and no
hang on a lock left by a killed build (issue 41, item 12)."""

from __future__ import annotations

import fcntl
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from engine.ops import cpu_kernels

FLAGS = ["-O3"]


@pytest.fixture
def ext_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "ext"))
    return tmp_path / "ext"


def test_build_folder_is_keyed_by_source_content_not_path(ext_root: Path, tmp_path: Path) -> None:
    a, b, c = (tmp_path / d / "cpu_kernels.cpp" for d in "abc")
    for f, text in ((a, "int x;"), (b, "int x;"), (c, "int y;")):
        f.parent.mkdir()
        f.write_text(text)
    fa, fb, fc = (cpu_kernels.build_directory(f, FLAGS) for f in (a, b, c))
    assert fa == fb != fc  # two checkouts of one source share a build; another source has its own
    assert (fa / "cpu_kernels.cpp").read_text() == "int x;"  # compiled from the folder's copy
    assert fa != cpu_kernels.build_directory(a, [*FLAGS, "-mavx2"])


def test_each_torch_install_has_its_own_build(
    ext_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two virtualenvs with the same torch version compile against their own headers: one
    folder for both made each rebuild it in turn (a fresh clone's CI beside a checkout)."""
    source = tmp_path / "cpu_kernels.cpp"
    source.write_text("int x;")
    here = cpu_kernels.build_directory(source, FLAGS)
    assert here.parent == ext_root  # TORCH_EXTENSIONS_DIR is where builds go
    monkeypatch.setattr(torch, "__file__", str(tmp_path / "other-venv" / "torch" / "__init__.py"))
    assert cpu_kernels.build_directory(source, FLAGS) != here


def test_a_stale_torch_lock_is_removed_under_the_build_lock(tmp_path: Path) -> None:
    (tmp_path / "lock").touch()  # what torch's FileBaton leaves when its builder is killed
    with cpu_kernels.build_lock(tmp_path, timeout_s=1):
        assert not (tmp_path / "lock").exists()


def test_a_held_build_lock_times_out_naming_its_holder(tmp_path: Path) -> None:
    with open(tmp_path / "servebench.lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        held.write("4242")
        held.flush()
        with (
            pytest.raises(TimeoutError, match="pid: 4242"),
            cpu_kernels.build_lock(tmp_path, timeout_s=0.3),
        ):
            pass


def test_the_engine_starts_over_a_killed_builds_lock() -> None:
    """A process killed mid-build leaves torch's lock file; the next start must not wait on it."""
    if not cpu_kernels.available():
        pytest.skip("the CPU kernels cannot be built here")
    flags = cpu_kernels.build_flags(torch.backends.cpu.get_cpu_capability())
    (cpu_kernels.build_directory(cpu_kernels.SOURCES, flags) / "lock").touch()
    code = "from engine.ops.cpu_kernels import available; assert available()"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
