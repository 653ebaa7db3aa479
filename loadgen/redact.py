"""What may leave the process: credentials are sent to the server but never written to a
results file or printed (headers, URLs), and text that came from a server is printed only
as printable characters (an escape sequence in an error message must not drive the terminal).
Records on disk keep a server's raw text: JSON escapes it, and nothing there is a credential."""

from __future__ import annotations

import re
import unicodedata
from urllib.parse import parse_qsl, quote, urlsplit, urlunsplit

MASK = "***"
# Names of headers and query parameters whose values are credentials (a substring rule, as
# proxies and loggers mask them): Authorization, Proxy-Authorization, Cookie, X-Api-Key,
# X-Auth-Token, X-Password, api_key, access_token, sig, ...
_SECRET_WORDS = ("auth", "key", "token", "secret", "passw", "pwd", "cookie", "session")
_SECRET_WORDS += ("credential", "signature", "sig", "bearer")
# RFC 9110's token: what a header name may be made of
_TOKEN = re.compile(r"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$")


def secret_name(name: str) -> bool:
    """A header or query parameter whose value is a credential of some kind."""
    lower = name.lower()
    return any(word in lower for word in _SECRET_WORDS)


def mask_headers(headers: dict[str, str]) -> dict[str, str]:
    """Headers as written to results files: credentials masked, the rest as sent."""
    return {k: MASK if secret_name(k) else v for k, v in headers.items()}


def parse_header(text: str) -> tuple[str, str]:
    """`NAME: VALUE` (split at the first ':', as HTTP writes it) or `NAME=VALUE` where NAME is
    a header name: `Authorization: Basic YWJj=` keeps its `=` in the value."""
    for sep in (":", "="):
        name, found, value = text.partition(sep)
        if found and _TOKEN.match(name.strip()):
            return name.strip(), value.strip()
    raise ValueError(
        f"header {redact_header_text(text)!r}: expected 'NAME: VALUE' (or NAME=VALUE), "
        "NAME a header name"
    )


def redact_header_text(text: str) -> str:
    """A header flag as it may be shown in an error: its name, never its value."""
    name = re.split(r"[:=\s]", text.strip(), maxsplit=1)[0]
    return f"{name}: {MASK}" if name and name != text.strip() else MASK


def redact_url(url: str) -> str:
    """`url` without its user:password@ and with the values of secret-looking query
    parameters masked: what config.json, summaries, reports and messages show."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return MASK
    netloc = parts.netloc
    if "@" in netloc:
        netloc = f"{MASK}@{netloc.rpartition('@')[2]}"
    query = parts.query
    if query:
        pairs = parse_qsl(query, keep_blank_values=True)
        query = "&".join(
            f"{quote(k, safe='')}={MASK if secret_name(k) else quote(v, safe='')}" for k, v in pairs
        )
    fragment = MASK if parts.fragment and "=" in parts.fragment else parts.fragment
    return urlunsplit((parts.scheme, netloc, parts.path, query, fragment))


def printable(text: object, limit: int = 2000) -> str:
    """Server-given text as it may reach a terminal: control and format characters (ESC,
    BEL, CR, bidi overrides, ...) shown as escapes, so none can retitle, clear or rewrite it;
    newlines and tabs kept."""
    out = []
    for ch in str(text)[:limit]:
        if ch in "\n\t":
            out.append(ch)
        elif unicodedata.category(ch) in ("Cc", "Cf", "Cs", "Co", "Cn"):
            out.append(ch.encode("unicode_escape").decode("ascii"))
        else:
            out.append(ch)
    return "".join(out) + ("..." if len(str(text)) > limit else "")


def redact_settings(value: object) -> object:
    """Settings as written to a results file (config.json, a sweep's plan): api keys, secret
    headers (as a table or as flags) and URL credentials masked, at any depth."""
    if isinstance(value, dict):
        return {k: _redact_item(str(k), v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [redact_settings(v) for v in value]
    return value


def _redact_item(key: str, value: object) -> object:
    if key == "api_key" and value:
        return MASK
    if key == "headers" and isinstance(value, dict):
        return mask_headers({str(k): str(v) for k, v in value.items()})
    if key == "headers" and isinstance(value, list | tuple):
        return [_masked_header_text(h) if isinstance(h, str) else h for h in value]
    if key.endswith("url") and isinstance(value, str):
        return redact_url(value)
    return redact_settings(value)


def _masked_header_text(text: str) -> str:
    try:
        name, value = parse_header(text)
    except ValueError:
        return redact_header_text(text)
    return f"{name}: {MASK if secret_name(name) else value}"
