"""Where an OpenAI-compatible server's API is: its root (with or without /v1, a query kept
after the path), the models it lists, and GETs that send a URL's credentials as auth."""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

from loadgen.redact import redact_url


def api_url(base_url: str, path: str) -> str:
    """`path` under the API root, the root's query (`?api-version=`, a key) kept after it."""
    parts = urlsplit(base_url)
    joined = f"{parts.path.rstrip('/')}/{path}" if path else parts.path.rstrip("/")
    return urlunsplit(parts._replace(path=joined))


def server_root(base_url: str) -> str:
    """The server's root beside its API root (/v1): where /metrics, /version, /props are."""
    parts = urlsplit(base_url)
    return urlunsplit(parts._replace(path=parts.path.rstrip("/").removesuffix("/v1")))


def http_get(url: str, api_key: str | None, timeout_s: float) -> Any:
    """urllib's GET, with a URL's user:password@ sent as Basic auth (aiohttp does the same)."""
    import base64
    import urllib.request

    parts = urlsplit(url)
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    if parts.username is not None:
        pair = f"{unquote(parts.username)}:{unquote(parts.password or '')}"
        headers.setdefault("Authorization", f"Basic {base64.b64encode(pair.encode()).decode()}")
        url = urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))
    return urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=timeout_s)


def resolve_base_url(base_url: str, api_key: str | None = None, timeout_s: float = 10) -> str:
    """The OpenAI API root to send to: `http://host:port/v1` as given, or `http://host:port`
    (vLLM's bench convention) when `/v1/models` answers there. Unreachable URLs are left as
    they are: the test request then fails naming them."""
    import urllib.error

    url = api_url(base_url, "")
    if urlsplit(url).path.endswith("/v1"):
        return url
    try:
        with http_get(api_url(url, "v1/models"), api_key, timeout_s):
            return api_url(url, "v1")
    except urllib.error.HTTPError as e:
        return api_url(url, "v1") if e.code in (401, 403) else url  # there, but wants a key
    except (OSError, ValueError):
        return url


def served_models(base_url: str, api_key: str | None = None, timeout_s: float = 10) -> list[str]:
    """The model ids a server lists at /v1/models (what `vllm bench serve` uses when no model
    is named)."""
    try:
        with http_get(api_url(base_url, "models"), api_key, timeout_s) as resp:
            return [m["id"] for m in json.loads(resp.read())["data"]]
    except (OSError, ValueError, KeyError, TypeError) as e:
        where, error = redact_url(base_url), str(e).replace(base_url, redact_url(base_url))
        raise ValueError(f"could not list the models of {where} (pass --model): {error}") from e
