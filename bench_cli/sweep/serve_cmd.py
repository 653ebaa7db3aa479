"""`bench sweep --serve-cmd`: any server (vLLM, SGLang, llama.cpp, `bench serve`) restarted
per point, its settings filled into the command from the sweep's grid:

    bench sweep --profile tune.toml --base-url http://127.0.0.1:8000 \\
        --serve-cmd 'vllm serve MODEL --max-num-seqs {max_num_seqs}'

A grid key the command does not use (nor the run: rate, concurrency, ...) is refused before
anything starts, as is a placeholder no grid key fills: a sweep over a setting that never
reaches the server would print differences that are noise."""

from __future__ import annotations

import shlex
import string
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from bench_cli.local_server import ServerProcess, free_port
from bench_cli.sweep.grid import SweepPoint

PORT = "port"  # the placeholder filled with a free port, not from the grid


@dataclass(frozen=True, slots=True)
class ServeCommand:
    template: str
    base_url: str | None = None  # may hold {port}
    ready_url: str | None = None  # may hold {port}
    ready_timeout: float = 600.0
    after_point_cmd: str | None = None

    def placeholders(self) -> set[str]:
        """The names the command fills ({max_num_seqs} -> max_num_seqs)."""
        try:
            return {
                name.split(".")[0].split("[")[0]
                for _, name, _, _ in string.Formatter().parse(self.template)
                if name
            }
        except ValueError as e:
            raise ValueError(f"--serve-cmd {self.template!r}: {e}") from None

    def check(self, points: list[SweepPoint], run_keys: set[str]) -> None:
        """Before anything starts: every placeholder filled by every point, every grid key
        used by the command or the run."""
        if not self.template.strip():
            raise ValueError("--serve-cmd is empty")
        used = self.placeholders()
        if self.base_url is None and PORT not in used:
            raise ValueError(
                "--serve-cmd needs --base-url (where its server listens) or a {port} "
                "placeholder (a free port a point)"
            )
        for point in points:
            if missing := sorted(used - {PORT} - set(point.settings)):
                names = ", ".join(f"{{{m}}}" for m in missing)
                raise ValueError(
                    f"--serve-cmd uses {names}, which no sweep key of point {point.label!r} sets"
                )
            if unused := sorted(set(point.settings) - used - run_keys):
                raise ValueError(
                    f"sweep key(s) {', '.join(unused)} reach neither --serve-cmd (no "
                    f"{{{unused[0]}}} in it) nor the load: that axis would change nothing"
                )
        self.command({k: "0" for k in used}, 0)  # shlex errors (an open quote) now

    def run_settings(self, settings: dict[str, Any]) -> dict[str, Any]:
        """What of a point's settings goes to the load (rate, ...): not the server's."""
        used = self.placeholders()
        return {k: v for k, v in settings.items() if k not in used}

    def command(self, settings: dict[str, Any], port: int) -> list[str]:
        values = {k: _text(v) for k, v in settings.items()} | {PORT: port}
        try:
            return [part.format_map(values) for part in shlex.split(self.template)]
        except ValueError as e:
            raise ValueError(f"--serve-cmd {self.template!r}: {e}") from None

    def server(self, settings: dict[str, Any], log_path: Path) -> tuple[ServerProcess, str]:
        """A point's server (not started) and the base URL its load goes to."""
        port = free_port()
        base_url = (self.base_url or "http://127.0.0.1:{port}/v1").format(port=port)
        if self.ready_url:
            ready = [self.ready_url.format(port=port)]
        else:  # vLLM, SGLang and llama.cpp answer /health; any OpenAI server /v1/models
            parts = urlsplit(base_url)
            root = f"{parts.scheme}://{parts.netloc}"
            ready = [f"{root}/health", f"{root}/v1/models"]
        return ServerProcess(self.command(settings, port), log_path, ready), base_url

    def after_point(self, log_path: Path) -> None:
        """--after-point-cmd after each run of a point (e.g. reset a cache), its output in
        log_path; a failure stops the sweep: the next point would start from an unknown state."""
        if not self.after_point_cmd:
            return
        with log_path.open("ab") as log:
            try:
                done = subprocess.run(
                    self.after_point_cmd,
                    shell=True,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    timeout=self.ready_timeout,
                    check=False,
                )
            except subprocess.TimeoutExpired:
                raise ValueError(
                    f"--after-point-cmd still ran after {self.ready_timeout:.0f} s "
                    "(--ready-timeout)"
                ) from None
        if done.returncode:
            raise ValueError(
                f"--after-point-cmd exited with code {done.returncode} (its output: {log_path})"
            )

    def record(self) -> dict[str, Any]:
        return {
            "serve_cmd": self.template,
            "ready_url": self.ready_url,
            "ready_timeout": self.ready_timeout,
            "after_point_cmd": self.after_point_cmd,
        }


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)
