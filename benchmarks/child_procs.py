"""Child processes a benchmark starts, stopped on every exit path with all they started.

vLLM's LLM() forks an EngineCore process and workers: killing only the child we started left
them running (one busy-polled a core for an hour). So the child leads its own process group
and the whole group is stopped when the benchmark ends, however it ends: normally, on an
exception or Ctrl-C (`finally`), on SIGTERM or SIGHUP (turned into SystemExit so `finally`
runs), and when the benchmark is SIGKILLed (the kernel sends the child SIGTERM,
PR_SET_PDEATHSIG, and `stop_group_on_sigterm` in the child takes its group down).
The child side (stop_group_on_sigterm) is standard library only: it runs under vLLM's
interpreter."""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import subprocess
import time
from collections.abc import Iterator, Sequence
from typing import Any


def stop_group(proc: subprocess.Popen, grace_s: float = 10.0) -> None:
    """SIGTERM to the child's whole process group, SIGKILL to what is left after grace_s."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            break  # the group is gone
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and _group_alive(proc.pid):
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=0.1)  # reaps the leader; the group may outlive it
            time.sleep(0.05)
        if not _group_alive(proc.pid):
            break
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=grace_s)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


@contextlib.contextmanager
def signals_exit() -> Iterator[None]:
    """SIGTERM and SIGHUP raise SystemExit (128 + the signal) so `finally` blocks run."""

    def leave(sig: int, frame: Any) -> None:
        raise SystemExit(128 + sig)

    old = {sig: signal.signal(sig, leave) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)


@contextlib.contextmanager
def group_child(cmd: Sequence[str], **kwargs: Any) -> Iterator[subprocess.Popen]:
    """subprocess.Popen for a child that may start children: its own process group, dying
    with us (the bundled server's PR_SET_PDEATHSIG set-up, so it runs in our interpreter),
    stopped with all of its group when the block ends, however it ends."""
    from bench_cli.local_server import die_with_parent

    dies = functools.partial(die_with_parent, os.getpid())
    then = kwargs.pop("preexec_fn", None)  # the caller's own set-up (e.g. a CPU pin) runs after

    def preexec() -> None:
        dies()
        if then is not None:
            then()

    proc = subprocess.Popen(cmd, start_new_session=True, preexec_fn=preexec, **kwargs)
    try:
        with signals_exit():
            yield proc
    finally:
        stop_group(proc)


def run_group(
    cmd: Sequence[str],
    check: bool = False,
    capture_output: bool = False,
    timeout: float | None = None,
    **kwargs: Any,
) -> subprocess.CompletedProcess:
    """subprocess.run in a group_child: stragglers of a normal exit are stopped too."""
    if capture_output:
        kwargs |= {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE}
    with group_child(cmd, **kwargs) as proc:
        out, err = proc.communicate(timeout=timeout)
    if check and proc.returncode:
        raise subprocess.CalledProcessError(proc.returncode, list(cmd), out, err)
    return subprocess.CompletedProcess(list(cmd), proc.returncode, out, err)


def stop_group_on_sigterm() -> None:
    """In the child (a group leader): on SIGTERM, take the whole group down, itself too."""

    def stop(sig: int, frame: Any) -> None:
        os.killpg(0, signal.SIGKILL)  # the group got SIGTERM with us, or has no parent left

    signal.signal(signal.SIGTERM, stop)
