"""OpenMP's wait policy (engine/omp_wait.py): set at `import engine` so torch's libgomp reads
it (short spins by default); a user's choice kept; greedy tokens the same either way."""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path

from engine.omp_wait import SPIN_COUNT, choose

ROOT = Path(__file__).resolve().parents[2]
OMP_VARS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "SERVEBENCH_OMP_PASSIVE", "OMP_DISPLAY_ENV")


def run(code: str, **env: str) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if k not in OMP_VARS}
    base["OMP_DISPLAY_ENV"] = "VERBOSE"  # libgomp prints the settings it runs with, on load
    return subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env={**base, **env}, capture_output=True,
        text=True, timeout=300, check=True,
    )  # fmt: skip


def spincount(done: subprocess.CompletedProcess) -> int:
    return int(re.search(r"GOMP_SPINCOUNT = '(\d+)'", done.stderr).group(1))


def test_import_engine_can_make_torchs_openmp_threads_sleep_when_idle() -> None:
    done = run("import engine, torch; print(engine.omp_wait.state.policy)",
               SERVEBENCH_OMP_PASSIVE="1")  # fmt: skip
    assert done.stdout.strip() == "passive"
    assert spincount(done) == 0  # libgomp's own default is 300000 spins


def test_threads_spin_briefly_by_default_whatever_the_load() -> None:
    assert choose({}, torch_loaded=False).policy == f"spin {SPIN_COUNT}"
    assert choose({"SERVEBENCH_OMP_PASSIVE": "1"}, False).policy == "passive"
    assert choose({"SERVEBENCH_OMP_PASSIVE": "0"}, False).policy == "default"
    late = choose({}, torch_loaded=True)
    assert late.policy == "default" and "imported before engine" in late.reason
    done = run("import engine, torch; print(engine.omp_wait.state.policy)")
    assert done.stdout.strip() == f"spin {SPIN_COUNT}" and spincount(done) == SPIN_COUNT


def test_a_users_wait_policy_is_kept() -> None:
    done = run("import engine, torch", GOMP_SPINCOUNT="12345")
    assert spincount(done) == 12345


def test_opting_out_leaves_libgomps_default() -> None:
    done = run("import engine, torch", SERVEBENCH_OMP_PASSIVE="0")
    assert spincount(done) > 0


def test_torch_imported_first_is_reported_not_hidden() -> None:
    done = run("import torch, engine; print(engine.omp_wait.state.reason)",
               SERVEBENCH_OMP_PASSIVE="1")  # fmt: skip
    assert "imported before engine" in done.stdout
    assert spincount(done) > 0


GENERATE = """
import json, engine, torch
from engine import LLM, SamplingParams
torch.set_num_threads(2)
llm = LLM("tiny-llama", dtype="float32", max_num_seqs=4, enable_prefix_caching=False)
prompts = [[5 + i, 17, 33 + 2 * i, 8, 91] * 6 for i in range(4)]
params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
print(json.dumps([o.outputs[0].token_ids for o in llm.generate(prompts, params)]))
"""


def test_greedy_tokens_do_not_depend_on_the_wait_policy() -> None:
    passive = run(GENERATE, SERVEBENCH_OMP_PASSIVE="1")
    spinning = run(GENERATE, SERVEBENCH_OMP_PASSIVE="0")
    assert spincount(passive) == 0 and spincount(spinning) > 0
    tokens = json.loads(passive.stdout.splitlines()[-1])
    assert tokens == json.loads(spinning.stdout.splitlines()[-1])
    assert len(tokens) == 4 and all(len(t) == 12 for t in tokens)


POOLS = """
import asyncio, os, time, engine, torch
from engine import omp_wait
torch.set_num_threads(2)

def threads_after(release):  # the process's threads once this thread's pool is freed, or not
    freed = omp_wait.release_thread_pool() if release else None
    time.sleep(0.3)  # the pool's workers exit on their own
    return freed, len(os.listdir("/proc/self/task"))

BUILD
big = torch.ones(1 << 22)
(big + big).sum()  # a parallel region on this thread whatever the engine did: a pool
print("before", (threads_after(False), threads_after(True)))
(big + big).sum()

async def serve():
    from engine.core.request import SamplingParams
    from engine.serving.async_engine import AsyncLLMEngine
    server = AsyncLLMEngine(llm)
    await server.start()
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    async for out in server.generate("r0", [5, 17, 33, 8, 91] * 4, params):
        pass
    print("serving", (threads_after(False), threads_after(True)))  # on the event loop's thread
    await server.stop()

asyncio.run(serve())
"""


def test_release_thread_pool_frees_this_threads_openmp_workers() -> None:
    done = run(POOLS.replace("BUILD", "llm = None").split("async def")[0], OMP_NUM_THREADS="2")
    before = done.stdout.split("before ")[1].strip()
    (_, kept), (freed, left) = ast.literal_eval(before)
    assert freed is True and left == kept - 1  # two threads a pool: this one and one worker


def test_the_engine_thread_holds_the_only_openmp_pool() -> None:
    """The server builds the engine on one thread and steps it on another; a pool left on the
    first makes libgomp throttle every idle thread to 100 spins (decode steps 1.5x slower)."""
    build = (
        "from engine.config import EngineConfig\nfrom engine.engine import LLMEngine\n"
        'llm = LLMEngine(EngineConfig.from_kwargs("tiny-llama", dtype="float32"))'
    )
    done = run(POOLS.replace("BUILD", build), OMP_NUM_THREADS="2")
    (_, kept), (freed, left) = ast.literal_eval(done.stdout.split("serving ")[1].strip())
    assert freed is True and left == kept  # the loop's thread had no pool left to free


STEP_ON_A_THREAD = """
import threading, engine, torch
from engine import omp_wait
from engine.core.request import SamplingParams
from engine.config import EngineConfig
from engine.engine import LLMEngine
torch.set_num_threads(2)
llm = LLMEngine(EngineConfig.from_kwargs("tiny-llama", dtype="float32"))
params = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
llm.add(llm.make_request("r0", [5, 17, 33, 8, 91] * 4, params))
llm.step()  # on this thread: no warning
RELEASE
thread = threading.Thread(target=lambda: [llm.step() for _ in range(3)])
thread.start()
thread.join()
"""


def test_stepping_on_another_thread_warns_unless_the_pool_was_released() -> None:
    held = run(STEP_ON_A_THREAD.replace("RELEASE", ""), OMP_NUM_THREADS="2")
    released = run(STEP_ON_A_THREAD.replace("RELEASE", "omp_wait.release_thread_pool()"),
                   OMP_NUM_THREADS="2")  # fmt: skip
    assert held.stderr.count("stepped on a thread other than the one that built it") == 1
    assert "stepped on a thread other" not in released.stderr
