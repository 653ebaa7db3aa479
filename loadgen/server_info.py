"""Which server a run measured, as the server itself says: its kind from /v1/models'
`owned_by` ("vllm", "sglang", "llamacpp", "servebench"), its version from the endpoint that
kind has (vLLM's /version, SGLang's /get_server_info, llama.cpp's /props build_info), and the
model path it serves (vLLM's and SGLang's `root`, llama.cpp's /props `model_path`): what
config.json records and what the tokenizer can be resolved from. A server that answers none of
these is "unknown", said so, never guessed."""

from __future__ import annotations

import json
import urllib.error
from dataclasses import asdict, dataclass, field
from typing import Any

from loadgen.endpoints import api_url, http_get, server_root

# owned_by -> (endpoint beside /v1, its JSON key holding the version)
VERSION_ENDPOINTS = {
    "vllm": ("version", "version"),
    "sglang": ("get_server_info", "version"),
    "llamacpp": ("props", "build_info"),
    "servebench": ("version", "version"),
}
KNOWN_KINDS = tuple(VERSION_ENDPOINTS)


@dataclass(slots=True)
class ServerInfo:
    kind: str = "unknown"  # one of KNOWN_KINDS, or unknown
    version: str | None = None
    model_path: str | None = None  # the model as the server was given it (may be relative)
    server_header: str | None = None  # the HTTP Server header, when it sent one
    listed: bool = False  # /v1/models answered (False: down, or not OpenAI-compatible)
    detected_from: list[str] = field(default_factory=list)  # what said so, for config.json

    def describe(self) -> dict[str, Any]:
        return asdict(self)

    def text(self) -> str:
        """One line for the console."""
        if self.kind == "unknown":
            return "server kind not detected (no owned_by, /version, /props or /get_server_info)"
        return f"{self.kind} {self.version or '(version not reported)'}"


def _get_json(url: str, api_key: str | None, timeout_s: float) -> tuple[Any, dict[str, str]]:
    with http_get(url, api_key, timeout_s) as resp:
        return json.loads(resp.read()), dict(resp.headers)


def detect_server(
    base_url: str, model: str | None, api_key: str | None = None, timeout_s: float = 5
) -> ServerInfo:
    """Ask the server; every failure only means less is known (a run never fails here)."""
    info = ServerInfo()
    root = server_root(base_url)
    try:
        listing, headers = _get_json(api_url(base_url, "models"), api_key, timeout_s)
        info.server_header, info.listed = headers.get("Server"), True
        entries = [m for m in listing.get("data") or [] if isinstance(m, dict)]
        entry = next((m for m in entries if m.get("id") == model), entries[0] if entries else {})
        owned_by = str(entry.get("owned_by") or "")
        if owned_by in VERSION_ENDPOINTS:
            info.kind = owned_by
            info.detected_from.append(f"/v1/models owned_by={owned_by}")
        if isinstance(entry.get("root"), str):  # vLLM, SGLang: the path it loaded
            info.model_path = entry["root"]
    except urllib.error.HTTPError:
        pass  # there, but no listing (or wants a key): its other endpoints may still say
    except OSError:
        return info  # down or not answering: asking three more endpoints costs their timeouts
    except (ValueError, AttributeError):
        pass
    kinds = [info.kind] if info.kind != "unknown" else ["llamacpp", "vllm", "sglang"]
    for kind in kinds:  # owned_by silent: the first kind-specific endpoint that answers
        path, key = VERSION_ENDPOINTS[kind]
        try:
            body, _ = _get_json(api_url(root, path), api_key, timeout_s)
        except (OSError, ValueError):
            continue
        if not isinstance(body, dict) or key not in body:
            continue
        info.version = str(body[key])
        if info.kind == "unknown":
            info.kind = kind
        info.detected_from.append(f"/{path} {key}")
        if kind == "llamacpp" and isinstance(body.get("model_path"), str):
            info.model_path = body["model_path"]
        if kind == "sglang" and isinstance(body.get("tokenizer_path"), str):
            info.model_path = body["tokenizer_path"]
        break
    return info
