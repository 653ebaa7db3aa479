"""llama.cpp for benchmarks/llamacpp_side_by_side.py: built from the sources that the
llama-cpp-python sdist vendors, its GGUF conversions, and llama-batched-bench runs and output."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Any

LLAMACPP_SPEC = "llama-cpp-python==0.3.36"
TARGETS = ("llama-batched-bench", "llama-quantize")
GGUF_TYPES = {"float32": "F32", "bfloat16": "BF16"}  # llama-quantize's names
KV_TYPES = {"float32": "f32", "bfloat16": "bf16"}  # -ctk / -ctv
CMAKE_FLAGS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DBUILD_SHARED_LIBS=OFF",
    "-DGGML_NATIVE=ON",  # -march=native: AVX512-BF16 where this CPU has it
    "-DGGML_CCACHE=OFF",
    "-DGGML_OPENMP_FETCH=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_BUILD_BORINGSSL=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_SERVER=OFF",
    "-DLLAMA_BUILD_APP=OFF",
    "-DLLAMA_BUILD_UI=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",
    "-DFETCHCONTENT_FULLY_DISCONNECTED=ON",  # no network during the build
)

# ---- llama-batched-bench's output ---------------------------------------------------------

COLUMNS = {"PP": "pp", "TG": "tg", "B": "b", "N_KV": "n_kv", "T_PP s": "t_pp_s",
           "S_PP t/s": "pp_tok_s", "T_TG s": "t_tg_s", "S_TG t/s": "tg_tok_s", "T s": "t_s",
           "S t/s": "tok_s"}  # fmt: skip


def parse_batched_bench(text: str) -> list[dict[str, float]]:
    """The rows of llama-batched-bench's markdown table, keyed by COLUMNS' names (columns
    found by their header, not their position). Raises ValueError where no table is."""
    header: list[str] | None = None
    rows = []
    for line in text.splitlines():
        if not line.lstrip().startswith("|"):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if "S_TG t/s" in cells:
            header = [COLUMNS.get(c, c) for c in cells]
        elif header and len(cells) == len(header) and not set(cells[0]) <= {"-", ":"}:
            rows.append({k: float(v) for k, v in zip(header, cells, strict=True)})
    if header is None:
        raise ValueError("no llama-batched-bench table (no header with 'S_TG t/s') in its output")
    return rows


def bench_settings(text: str) -> dict[str, int]:
    """The line above the table: n_kv_max, n_batch, flash_attn, n_threads, ..."""
    for line in text.splitlines():
        if "n_kv_max =" in line:
            return {k: int(v) for k, v in re.findall(r"(\w+) = (-?\d+)", line)}
    return {}


def decode_tok_s(rows: list[dict[str, float]], pp: int, tg: int, batch: int) -> float:
    """S_TG of the (pp, tg, B) row, checked against B*tg / T_TG. batched-bench skips, without
    a word, a shape whose KV does not fit its context (-c): that is an error here."""
    found = [r for r in rows if (r["pp"], r["tg"], r["b"]) == (pp, tg, batch)]
    if not found:
        raise LookupError(f"llama-batched-bench printed no row for PP={pp} TG={tg} B={batch} "
                          f"(it skips shapes beyond its context: -c)")  # fmt: skip
    row = found[0]
    derived = batch * tg / row["t_tg_s"]
    if abs(derived / row["tg_tok_s"] - 1) > 0.02:
        raise ValueError(f"S_TG {row['tg_tok_s']} disagrees with B*TG/T_TG = {derived:.2f}")
    return row["tg_tok_s"]


# ---- set-up -------------------------------------------------------------------------------


def _run(*cmd: str | Path, **kwargs: Any) -> str:
    print("+", " ".join(map(str, cmd)), flush=True)
    return subprocess.run([str(c) for c in cmd], check=True, text=True, **kwargs).stdout


def build_tools(root: Path) -> tuple[str, str]:
    """cmake and ninja: the machine's, else pip-installed into a venv under root."""
    cmake, ninja = shutil.which("cmake"), shutil.which("ninja")
    if cmake and ninja:
        return cmake, ninja
    venv = root / "tools-venv"
    if not (venv / "bin" / "pip").exists():
        _run(sys.executable, "-m", "venv", venv)
    _run(venv / "bin" / "pip", "install", "-q", "cmake", "ninja")
    return cmake or str(venv / "bin" / "cmake"), ninja or str(venv / "bin" / "ninja")


def setup(root: Path, spec: str, model: str, jobs: int) -> None:
    from engine.model.sources import resolve_model_path

    root = root.expanduser().absolute()
    t0 = time.monotonic()
    sdists = root / "sdist"
    _run(sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:",
         spec, "-d", sdists)  # fmt: skip
    sdist = max(sdists.glob("llama_cpp_python-*.tar.gz"), key=lambda p: p.stat().st_mtime)
    name = sdist.name.removesuffix(".tar.gz")
    if not (root / "src" / name).is_dir():
        print(f"unpacking {sdist} into {root / 'src'}")
        with tarfile.open(sdist) as tar:
            tar.extractall(root / "src", filter="data")
    source = root / "src" / name / "vendor" / "llama.cpp"
    cmake, ninja = build_tools(root)
    build = root / "build"
    generator = ["-G", "Ninja", f"-DCMAKE_MAKE_PROGRAM={ninja}"]
    configured = _run(cmake, "-S", source, "-B", build, *generator, *CMAKE_FLAGS,
                      stdout=subprocess.PIPE)  # fmt: skip
    print(configured, end="")
    versions = re.findall(
        r"^-- (llama.cpp version|ggml version|ggml commit): +(\S+)", configured, re.M
    )
    _run(cmake, "--build", build, "--target", *TARGETS, "-j", str(jobs))
    built = time.monotonic()
    bins = {t: build / "bin" / t for t in TARGETS}
    models = {}
    src_gguf = resolve_model_path(model)
    for dtype, gtype in GGUF_TYPES.items():
        out = root / "models" / f"{model}-{gtype}.gguf"
        out.parent.mkdir(parents=True, exist_ok=True)
        log = out.with_suffix(".log")
        with log.open("w") as f:  # dequantizes Q4_1/Q8_0 to F32 (then rounds to BF16)
            _run(bins["llama-quantize"], "--allow-requantize", src_gguf, out, gtype,
                 stdout=f, stderr=subprocess.STDOUT)  # fmt: skip
        models[dtype] = str(out)
    info = {"sdist": str(sdist), "spec": spec, "source": str(source), "cmake_flags": CMAKE_FLAGS,
            "binaries": {k: str(v) for k, v in bins.items()}, "model": model,
            "model_source": str(src_gguf), "models": models, "cpu": cpu_name(),
            "versions": dict(versions), "compiler": compiler(build),
            "build_s": round(built - t0), "total_s": round(time.monotonic() - t0)}  # fmt: skip
    (root / "setup.json").write_text(json.dumps(info, indent=2))
    print(f"\nllama.cpp {dict(versions)} from {sdist.name}: sources {source}")
    print(
        f"built in {build} ({info['build_s']:.0f} s with download): "
        + ", ".join(map(str, bins.values()))
    )
    print(f"{src_gguf.name} converted: " + ", ".join(models.values()))
    print(f"written {root / 'setup.json'} (what --llamacpp-dir {root} reads)")


def compiler(build: Path) -> str:
    """The C++ compiler cmake chose, with its version, from the build's cache."""
    cache = (build / "CMakeCache.txt").read_text(errors="replace")
    path = re.search(r"^CMAKE_CXX_COMPILER:\w+=(.+)$", cache, re.M)
    if not path:
        return "unknown"
    version = subprocess.run([path[1], "--version"], capture_output=True, text=True).stdout
    return f"{path[1]}: {version.splitlines()[0] if version else '?'}"


def cpu_name() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor()


def run_llamacpp(setup_info: dict, args: argparse.Namespace, dtype: str, batch: int,
                 log: Path) -> dict[str, Any]:  # fmt: skip
    from child_procs import run_group

    pp, tg = args.prompt_len, args.gen_len
    cmd = [setup_info["binaries"]["llama-batched-bench"], "-m", setup_info["models"][dtype],
           "-t", str(args.threads), "-npp", str(pp), "-ntg", str(tg), "-npl", str(batch),
           "-c", str(batch * (pp + tg))]  # fmt: skip
    if args.llamacpp_kv == "match":
        cmd += ["-ctk", KV_TYPES[dtype], "-ctv", KV_TYPES[dtype]]
    extra = dict(v.split("=", 1) for v in args.llamacpp_env)  # e.g. OMP_WAIT_POLICY=PASSIVE
    with log.open("w") as f:
        env = {**os.environ, **extra}
        code = run_group(cmd, env=env, stdout=f, stderr=subprocess.STDOUT).returncode
    text = log.read_text(errors="replace")
    if code:
        tail = "\n".join(text.splitlines()[-15:])
        raise SystemExit(f"llama-batched-bench failed ({code}): {' '.join(cmd)}\n{tail}")
    rows = parse_batched_bench(text)
    return {"tok_s": decode_tok_s(rows, pp, tg, batch), "rows": rows,
            "settings": bench_settings(text), "command": cmd, "env": extra}  # fmt: skip
