"""The bundled engine as a child process (`bench serve`) on a free loopback port: the load
generator measures it through HTTP exactly as it would measure vLLM."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import shlex
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


class ServerProcess:
    """Any server command as a child in its own process group, which dies with us (see
    die_with_parent) and is stopped as a group: the bundled engine, or a `bench sweep
    --serve-cmd` server (vLLM, SGLang, llama.cpp, ...) restarted per point."""

    def __init__(
        self,
        cmd: list[str],
        log_path: Path,
        ready_urls: list[str],
        env: dict[str, str] | None = None,  # the server's whole environment; ours if None
    ) -> None:
        self.cmd, self.log_path, self.ready_urls = cmd, log_path, ready_urls
        self.env = env
        self.proc: subprocess.Popen | None = None
        self.ready_s: float | None = None  # how long start() waited for it to answer

    def start(self, timeout_s: float = 600.0) -> None:
        """Start and wait until one of the ready URLs answers 200 (the server's log in
        log_path); stops what it started before raising."""
        log = self.log_path.open("ab")
        try:
            self.proc = subprocess.Popen(
                self.cmd,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=(os.environ if self.env is None else self.env) | {"PYTHONUNBUFFERED": "1"},
                # its own process group: Ctrl-C reaches us first, we stop the server (and its
                # workers: the whole group) last
                start_new_session=True,
                preexec_fn=functools.partial(die_with_parent, os.getpid()),
            )
        except OSError as e:
            raise ServerStartError(f"`{shlex.join(self.cmd)}` did not start: {e}") from e
        finally:
            log.close()
        try:
            self._wait_ready(timeout_s)
        except BaseException:  # an interrupt while it starts included: nothing left behind
            self.stop()
            raise

    def _wait_ready(self, timeout_s: float) -> None:
        assert self.proc is not None
        t0 = time.monotonic()
        deadline = t0 + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise ServerStartError(
                    f"`{shlex.join(self.cmd)}` exited with code {self.proc.returncode}:\n"
                    + self.log_tail()
                )
            for url in self.ready_urls:
                try:
                    with urllib.request.urlopen(url, timeout=1):
                        self.ready_s = time.monotonic() - t0
                        return
                except (urllib.error.URLError, OSError, ValueError):
                    pass
            time.sleep(0.2)
        urls = " or ".join(self.ready_urls)
        raise ServerStartError(f"the server did not answer {urls} within {timeout_s:.0f} s")

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


class LocalServer(ServerProcess):
    def __init__(
        self, model: str, engine: dict[str, Any], log_path: Path, step_log: Path | None = None
    ) -> None:
        self.model, self.engine = model, engine
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}/v1"
        cmd = [sys.executable, "-m", "bench_cli", "serve", "--model", model]
        cmd += ["--port", str(self.port), *serve_flags(engine)]
        if step_log is not None:
            cmd += ["--step-log", str(step_log)]
        super().__init__(cmd, log_path, [f"http://127.0.0.1:{self.port}/health"])

    def engine_config(self) -> dict[str, Any] | None:
        """The server's resolved engine config, with its weight and KV memory under "memory",
        the attention, forward and linear paths it runs under "decode_attention",
        "model_forward" and "linears", its CPU threads under "cpu_threads" and
        "cpu_pool_threads", and the model's shape under "model_shape"."""
        try:
            with urllib.request.urlopen(f"{self.base_url}/engine/config", timeout=5) as r:
                body = json.loads(r.read())
                keys = ("memory", "decode_attention", "model_forward", "linears", "cpu_threads",
                        "cpu_pool_threads", "model_shape")  # fmt: skip
                extra = {k: body.get(k) for k in keys}
                return {**body["engine"], **extra}
        except (urllib.error.URLError, OSError, ValueError, KeyError):
            return None

    def __enter__(self) -> LocalServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
