"""`bench serve` as a newcomer watches it start (issue 45): each start-up phase is named as
it begins and timed as it ends (a first start compiles for minutes), and the access log
leaves out the /metrics and /health polls that would bury the requests."""

from __future__ import annotations

import logging

import pytest
from aiohttp import web
from aiohttp.test_utils import make_mocked_request

from engine.config import EngineConfig
from engine.engine import LLMEngine
from engine.serving.access_log import (
    QUIET_PATHS,
    QuietAccessLogger,
    parse_paths,
    quiet_access_logger,
)
from engine.startup import Phases


def test_engine_times_its_startup_phases(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="engine.startup")
    engine = LLMEngine(
        EngineConfig.from_kwargs("tiny-llama", dtype="float32", num_kv_blocks=32, max_num_seqs=2)
    )
    phases = engine.startup
    assert list(phases.times) == ["building kernels", "loading", "compiling"]  # CPU
    assert all(t >= 0 for t in phases.times.values())
    said = [r.getMessage() for r in caplog.records]
    assert said[0] == "building kernels ..." and "loading ..." in said, said
    assert any(m.startswith("compiling: ") for m in said), said
    line = phases.line()
    assert line.startswith("start-up: building kernels ") and "ready in" in line, line


def test_phases_line_names_each_phase_with_its_time() -> None:
    phases = Phases()
    phases.times |= {"loading": 1.234, "compiling": 61.0}
    assert phases.line() == "start-up: loading 1.2 s · compiling 61.0 s · ready in 62.2 s"


def _logged(logger_class: type, path: str, caplog: pytest.LogCaptureFixture) -> bool:
    caplog.clear()
    log = logger_class(logging.getLogger("aiohttp.access"), "%r %s")
    log.log(make_mocked_request("GET", path), web.Response(), 0.001)
    return any(path in r.getMessage() for r in caplog.records)


def test_access_log_leaves_out_metrics_and_health(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="aiohttp.access")
    assert QUIET_PATHS == ("/health", "/metrics")  # vLLM's --disable-access-log-for-endpoints
    assert not _logged(QuietAccessLogger, "/metrics", caplog)
    assert not _logged(QuietAccessLogger, "/health", caplog)
    assert _logged(QuietAccessLogger, "/v1/completions", caplog)
    every = quiet_access_logger(parse_paths(""))  # --disable-access-log-for-endpoints ''
    assert parse_paths(" /health, /metrics ") == QUIET_PATHS
    assert _logged(every, "/metrics", caplog)
