"""The bundled engine as a child process (`bench serve`) on a free loopback port: the load
generator measures it through HTTP exactly as it would measure vLLM."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any


class ServerStartError(RuntimeError):
    pass


PR_SET_PDEATHSIG = 1  # linux/prctl.h


def die_with_parent(parent: int) -> None:
    """In the child before exec: the kernel sends it SIGTERM when the thread that started it
    ends, SIGKILL of the whole parent included, where no `finally` of ours runs (a killed
    `bench run` left its server alive for half an hour). Linux only; elsewhere a no-op."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # the parent died before prctl: nobody is left to signal us
        os.kill(os.getpid(), signal.SIGTERM)


def _signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):  # gone already
        os.killpg(pgid, sig)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve_flags(engine: dict[str, Any]) -> list[str]:
    """Engine settings -> `bench serve` flags (booleans as --name / --no-name)."""
    flags = []
    for key, value in engine.items():
        name = key.replace("_", "-")
        if isinstance(value, bool):
            flags.append(f"--{name}" if value else f"--no-{name}")
        elif isinstance(value, dict):  # speculative_config from a profile's inline table
            flags += [f"--{name}", json.dumps(value)]
        else:
            flags += [f"--{name}", str(value)]
    return flags


class LocalServer:
    def __init__(
        self, model: str, engine: dict[str, Any], log_path: Path, step_log: Path | None = None
    ) -> None:
        self.model, self.engine, self.log_path = model, engine, log_path
        self.step_log = step_log
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}/v1"
        self.proc: subprocess.Popen | None = None

    def start(self, timeout_s: float = 600.0) -> None:
        cmd = [sys.executable, "-m", "bench_cli", "serve", "--model", self.model]
        cmd += ["--port", str(self.port), *serve_flags(self.engine)]
        if self.step_log is not None:
            cmd += ["--step-log", str(self.step_log)]
        log = self.log_path.open("wb")
        self.proc = subprocess.Popen(
            cmd,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=os.environ | {"PYTHONUNBUFFERED": "1"},
            # its own process group: Ctrl-C reaches us first, we stop the server (and its
            # workers: the whole group) last
            start_new_session=True,
            preexec_fn=functools.partial(die_with_parent, os.getpid()),
        )
        log.close()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise ServerStartError(
                    f"`{' '.join(cmd[2:])}` exited with code {self.proc.returncode}:\n"
                    + self.log_tail()
                )
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=1):
                    return
            except (urllib.error.URLError, OSError):
                time.sleep(0.2)
        self.stop()
        raise ServerStartError(f"the server was not healthy after {timeout_s:.0f} s")

    def engine_config(self) -> dict[str, Any] | None:
        """The server's resolved engine config, with its weight and KV memory under "memory",
        the attention, forward and linear paths it runs under "decode_attention",
        "model_forward" and "linears",
        and the model's shape under "model_shape"."""
        try:
            with urllib.request.urlopen(f"{self.base_url}/engine/config", timeout=5) as r:
                body = json.loads(r.read())
                keys = ("memory", "decode_attention", "model_forward", "linears", "model_shape")
                extra = {k: body.get(k) for k in keys}
                return {**body["engine"], **extra}
        except (urllib.error.URLError, OSError, ValueError, KeyError):
            return None

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self) -> None:
        """SIGINT to the server's process group (a clean shutdown), SIGKILL to the group
        after 20 s or if this wait is itself interrupted: nothing of it outlives us."""
        if self.proc is None:
            return
        try:
            if self.proc.poll() is None:
                _signal_group(self.proc.pid, signal.SIGINT)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.proc.wait(timeout=20)
        finally:
            _signal_group(self.proc.pid, signal.SIGKILL)  # what is left of the group
            self.proc.wait()

    def __enter__(self) -> LocalServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
