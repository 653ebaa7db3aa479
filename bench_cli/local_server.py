"""The bundled engine as a child process (`bench serve`) on a free loopback port: the load
generator measures it through HTTP exactly as it would measure vLLM."""

from __future__ import annotations

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
            start_new_session=True,  # Ctrl-C reaches us first; we stop the server last
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
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def __enter__(self) -> LocalServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
