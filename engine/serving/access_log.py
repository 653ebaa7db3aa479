"""The access log without the polls: a benchmark scrapes /metrics every second and a load
balancer probes /health, and their lines buried the requests. vLLM's
--disable-access-log-for-endpoints does the same; `bench serve` takes that flag."""

from __future__ import annotations

from aiohttp import web
from aiohttp.web_log import AccessLogger

QUIET_PATHS = ("/health", "/metrics")  # left out by default


class QuietAccessLogger(AccessLogger):
    quiet: frozenset[str] = frozenset(QUIET_PATHS)

    def log(self, request: web.BaseRequest, response: web.StreamResponse, time: float) -> None:
        if request.path not in self.quiet:
            super().log(request, response, time)


def quiet_access_logger(paths: tuple[str, ...] | list[str]) -> type[QuietAccessLogger]:
    """The access logger leaving these paths out (none: it logs every request)."""
    return type("QuietAccessLogger", (QuietAccessLogger,), {"quiet": frozenset(paths)})


def parse_paths(text: str) -> tuple[str, ...]:
    """'/health,/metrics' as vLLM's flag takes it; '' for none."""
    return tuple(p.strip() for p in text.split(",") if p.strip())
