"""The machine's CPU in the timeline: busy and stolen time from the kernel's counters, and the
run's warning when a hypervisor took a share of the CPUs that moves latencies."""

from __future__ import annotations

import functools
import json
import subprocess
import sys
import time
from collections import namedtuple
from collections.abc import Callable
from pathlib import Path

import pandas as pd
import pytest

from loadgen import telemetry
from loadgen.machine_cpu import STEAL_WARN, MachineCpu, steal_warning
from loadgen.telemetry import Telemetry
from tests.cli.test_bench_run import bench_run

_CpuTimes = namedtuple(  # psutil.cpu_times()'s type on Linux
    "_CpuTimes", "user nice system idle iowait irq softirq steal guest guest_nice"
)


def _times(user: float, idle: float, steal: float, guest: float = 0.0) -> tuple:
    """psutil.cpu_times() as Linux gives it: guest time is inside user as well."""
    return _CpuTimes(user, 0.0, 0.0, idle, 0.0, 0.0, 0.0, steal, guest, 0.0)


class _Counters:
    """cpu_times() advancing by one interval of 2 CPUs each call: busy, idle and stolen CPU
    seconds per interval as given."""

    def __init__(self, busy: float, idle: float, steal: float, guest: float = 0.0) -> None:
        self.step = (busy, idle, steal, guest)
        self.n = 0

    def __call__(self) -> tuple:
        busy, idle, steal, guest = self.step
        n = self.n
        self.n += 1
        return _times((busy + guest) * n, idle * n, steal * n, guest * n)


def _machine(counters: _Counters) -> MachineCpu:
    return MachineCpu(cpu_times=counters, cpus=2)


def test_busy_and_stolen_time_are_percent_of_one_core() -> None:
    # each interval of 2 CPUs x 0.1 s: 0.12 s busy, 0.05 idle, 0.03 stolen (+ guest counted
    # in user, which must not count twice)
    machine = _machine(_Counters(busy=0.12, idle=0.05, steal=0.03, guest=0.01))
    row: dict[str, float] = {}
    machine.sample(row)
    # busy counts the guest's 0.01 once: 0.13 of 0.21 CPU seconds, on 2 CPUs
    assert row["machine_cpu_percent"] == pytest.approx(0.13 / 0.21 * 200)
    assert row["machine_steal_percent"] == pytest.approx(0.03 / 0.21 * 200)


def test_no_new_ticks_give_no_row() -> None:
    machine = _machine(_Counters(busy=0.0, idle=0.0, steal=0.0))
    row: dict[str, float] = {}
    machine.sample(row)
    assert row == {}


@pytest.mark.parametrize(
    ("mean", "warned"), [(None, False), (0.0, False), (9.9, False), (10.0, True), (60.0, True)]
)
def test_the_warning_starts_at_its_share_of_the_machine(mean: float | None, warned: bool) -> None:
    telemetry = {"machine_cpus": 2, "peak_machine_steal_percent": 80.0}
    if mean is not None:
        telemetry["mean_machine_steal_percent"] = mean
    assert STEAL_WARN == 0.05  # 10 % of one core is 5 % of a 2-core machine
    text = steal_warning(telemetry)
    assert (text is not None) == warned
    if warned:
        assert f"{mean / 200:.0%} of this machine's CPU time" in text and "peak 80 %" in text


def test_a_busy_process_shows_in_the_machines_cpu() -> None:
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        sampler = Telemetry(pid=None, interval_s=0.05)
        sampler.start()
        time.sleep(0.8)
        sampler.stop()
    finally:
        busy.kill()
        busy.wait()
    s = sampler.summary()
    assert s["machine_cpus"] >= 1 and "machine_cpu_percent" in s["columns"]
    assert s["mean_machine_cpu_percent"] > 50  # the loop's core, at least half the time
    assert "machine_steal_percent" in s["columns"]  # Linux counts it, 0 or not


def _stolen_third() -> tuple:
    t = time.monotonic()  # CPU seconds of 2 CPUs since "boot": 1/3 stolen, 1/3 busy, 1/3 idle
    return _times(user=2 * t / 3, idle=2 * t / 3, steal=2 * t / 3)


def _steal_a_third(monkeypatch: pytest.MonkeyPatch) -> None:
    """Telemetry's machine sampler reads a 2-CPU machine losing a third of its time."""
    monkeypatch.setattr(
        telemetry, "MachineCpu", functools.partial(MachineCpu, cpu_times=_stolen_third, cpus=2)
    )


def test_a_run_on_a_stolen_machine_says_so(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, mock_server: Callable[..., str]
) -> None:
    """A third of the machine's CPU time stolen while the run measured: the numbers stand,
    with a warning in the terminal and summary.json, and the timeline has the column."""
    _steal_a_third(monkeypatch)
    url = mock_server("--ttft", "0.01", "--itl", "0.005")
    rc, printed, out = bench_run(tmp_path, base_url=url, model="mock", warmup=0, num_requests=8)
    assert rc == 0, printed
    summary = json.loads((out / "summary.json").read_text())
    warning = next(w for w in summary["warnings"] if w.startswith("the hypervisor gave"))
    assert "33% of this machine's CPU time" in warning
    assert "the hypervisor gave" in " ".join(printed.split())
    timeline = pd.read_csv(out / "timeline.csv")
    assert timeline["machine_steal_percent"].mean() == pytest.approx(66.7, abs=15)


def test_a_bundled_run_on_a_stolen_machine_says_what_held_the_engine(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """An engine on OpenMP's threads sleeps between regions by default: the warning says
    what to change, unless the user chose a policy. An engine that reports its kernels' own
    pool (config.json's cpu_pool_threads) waits for no thread: nothing more is said."""
    from engine import omp_wait
    from engine.engine import LLMEngine

    _steal_a_third(monkeypatch)
    for pool, policy, advised in [(1, "spin 3000", True), (1, "default", False),
                                  (2, "spin 3000", False)]:  # fmt: skip
        monkeypatch.setattr(LLMEngine, "cpu_pool_threads", property(lambda _, n=pool: n))
        monkeypatch.setattr(omp_wait, "state", omp_wait.WaitPolicy(policy, "test"))
        rc, printed, out = bench_run(
            tmp_path / f"{pool}-{policy}", in_process=True, warmup=0, num_requests=4, rate=None,
            concurrency=2,
        )  # fmt: skip
        assert rc == 0, printed
        assert json.loads((out / "config.json").read_text())["engine"]["cpu_pool_threads"] == pool
        warning = next(
            w
            for w in json.loads((out / "summary.json").read_text())["warnings"]
            if w.startswith("the hypervisor gave")
        )
        assert ("SERVEBENCH_OMP_PASSIVE=0" in warning) == advised, warning
