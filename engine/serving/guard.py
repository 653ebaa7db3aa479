"""What stands between a client and the handlers: the API key, the body's size and read time,
how many bodies may be read at once, and turning every failure into an OpenAI-style answer.

A client that sends slowly, too much, or leaves must cost the server a bounded share of its
sockets and never a traceback; /health and other clients go on being served."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
import resource
from dataclasses import dataclass
from typing import Any

from aiohttp import http_exceptions, web

from engine.serving.limits import ServerLimits
from engine.serving.protocol import APIError

log = logging.getLogger(__name__)

DECODED = ("identity", "", "gzip", "x-gzip", "deflate")  # the request codings aiohttp decodes
MAX_FDS = 65535  # the soft fd limit `bench serve` asks for, as vLLM's server does


@dataclass
class Guard:
    api_key_digest: bytes | None  # sha256 of the key: compared in constant time
    limits: ServerLimits
    body_reads: int = 0  # bodies being received now
    refused_total: int = 0  # requests refused by these limits (408, 413, 503)


GUARD_KEY = web.AppKey("guard", Guard)


def make_guard(api_key: str | None, limits: ServerLimits) -> Guard:
    if api_key is not None and not api_key:
        raise ValueError("the API key is empty: give a non-empty key, or none for an open server")
    return Guard(None if api_key is None else _digest(api_key), limits)


def _digest(text: str) -> bytes:
    return hashlib.sha256(text.encode("utf-8", "surrogateescape")).digest()


def key_matches(authorization: str, key_digest: bytes) -> bool:
    """'Bearer KEY' against the key's digest; comparing equal-length digests with
    compare_digest takes the same time whatever prefix of the key a guess gets right."""
    scheme, _, token = authorization.partition(" ")
    matches = hmac.compare_digest(_digest(token.strip()), key_digest)
    return matches and scheme.lower() == "bearer"


def guarded(request: web.Request) -> bool:
    """The /v1 routes need the key; /health, /metrics and /version do not (as in vLLM)."""
    resource = request.match_info.route.resource
    canonical = resource.canonical if resource is not None else ""
    return request.path.startswith("/v1/") or canonical.startswith("/v1/")


def error_response(err: APIError) -> web.Response:
    return web.json_response(err.body(), status=err.status)


@web.middleware
async def errors_and_auth(request: web.Request, handler: Any) -> web.StreamResponse:
    guard = request.app[GUARD_KEY]
    key = guard.api_key_digest
    if key and guarded(request) and not key_matches(request.headers.get("Authorization", ""), key):
        err = APIError("invalid or missing API key", 401, type_="authentication_error")
        return error_response(err)
    try:
        return await handler(request)
    except APIError as e:
        return error_response(e)
    except web.HTTPException as e:
        if e.status >= 400:
            return error_response(APIError(e.reason, e.status, type_="invalid_request_error"))
        raise
    except ConnectionResetError:  # the client left (or half-closed) before its answer
        log.info("client left before the answer to %s %s", request.method, request.path)
        return web.Response(status=499)  # nginx's "client closed request"; it is never sent
    except asyncio.CancelledError:
        raise
    except Exception as e:  # a bug of ours: still an OpenAI-shaped answer, and a traceback
        log.exception("unhandled error on %s %s", request.method, request.path)
        err = APIError(f"internal error: {type(e).__name__}", 500, type_="server_error")
        return error_response(err)


async def read_body(request: web.Request) -> bytes:
    """The body's bytes within the limits. A refused body is left unread: the answer says
    so and the connection closes after it (aiohttp does not wait for the rest)."""
    guard = request.app[GUARD_KEY]
    limits = guard.limits
    encoding = request.headers.get("Content-Encoding", "identity").strip().lower()
    if encoding not in DECODED:  # aiohttp would hand over the coded bytes as they are
        raise APIError(f"the Content-Encoding {encoding[:40]!r} is not supported: use gzip", 415)
    size = request.content_length
    if size is not None and size > limits.max_body_bytes:
        raise _refused(guard, 413, f"the body has {size} bytes; at most {limits.max_body_bytes}")
    if request.content.is_eof():  # all of it is here already: no wait, no slot taken
        return await _read(request, guard)
    if guard.body_reads >= limits.max_body_reads:
        msg = "the server is receiving too many bodies at once; retry"
        raise _refused(guard, 503, msg, "server_error")
    guard.body_reads += 1
    try:
        async with asyncio.timeout(limits.body_timeout_s):
            return await _read(request, guard)
    except TimeoutError:
        raise _refused(
            guard, 408, f"the body did not arrive within {limits.body_timeout_s:g} s"
        ) from None
    finally:
        guard.body_reads -= 1


async def _read(request: web.Request, guard: Guard) -> bytes:
    limits = guard.limits
    try:
        return await request.read()
    except web.HTTPRequestEntityTooLarge:  # no Content-Length (chunked, or decompressed)
        raise _refused(guard, 413, f"the body is over {limits.max_body_bytes} bytes") from None
    except (web.RequestPayloadError, http_exceptions.HttpProcessingError) as e:
        # a body aiohttp cannot decode: bad gzip/deflate, broken chunked encoding
        raise APIError(f"the body could not be read: {_first_line(e)}") from None


def _refused(
    guard: Guard, status: int, message: str, type_: str = "invalid_request_error"
) -> APIError:
    guard.refused_total += 1
    return APIError(message, status, type_=type_)


def _first_line(e: Exception) -> str:
    cause = e.__cause__ or e
    return str(getattr(cause, "message", cause)).strip().splitlines()[0]


async def read_json(request: web.Request) -> dict[str, Any]:
    """JSON is UTF-8 (RFC 8259), so the body's bytes are parsed whatever charset the header
    names, as vLLM's server does. Python's parser raises more than JSONDecodeError on
    absurd input: ValueError for integers past its digit limit, RecursionError for deep
    nesting; each is the client's fault."""
    raw = await read_body(request)
    try:
        body = json.loads(raw)
    except RecursionError as e:
        raise APIError("the body is not valid JSON: it is nested too deeply") from e
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError, too many digits
        if str(e).startswith("Exceeds the limit"):  # Python's int-string limit (4,300 digits)
            raise APIError(f"a number in the body has too many digits: {e}".split(";")[0]) from e
        raise APIError(f"the body is not valid JSON: {e}") from e
    if not isinstance(body, dict):
        raise APIError("the body must be a JSON object")
    return body


class ClientFaults(logging.Filter):
    """aiohttp logs a client's malformed HTTP (a bad header, a coding it cannot decode) and a
    peer gone mid-request as ERROR with a traceback; both are the client's doing, so they
    become one INFO line."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, http_exceptions.HttpProcessingError | ConnectionResetError):
            record.msg = f"{record.getMessage()}: {type(exc).__name__}: {_first_line(exc)}"
            record.args = ()
            record.exc_info = record.exc_text = None
            record.levelno, record.levelname = logging.INFO, "INFO"
        return True


def raise_fd_limit(target: int = MAX_FDS) -> int:
    """Raise the soft open-files limit toward `target` (as vLLM's set_ulimit does): each
    connection holds a descriptor, and at the limit the server stops accepting, /health
    included. Returns the soft limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = target if hard == resource.RLIM_INFINITY else min(target, hard)
    if soft != resource.RLIM_INFINITY and soft < want:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
            soft = want
        except (ValueError, OSError) as e:
            log.warning("could not raise the open-files limit from %d: %s", soft, e)
    return soft
