"""Parsing and validating OpenAI-style request bodies; every problem becomes an `APIError`
that the server turns into a 4xx with an OpenAI-shaped error body."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from engine.core.request import SamplingParams
from engine.core.stop_strings import check_stops
from engine.model.tokenizer import check_unicode


class APIError(Exception):
    def __init__(
        self,
        message: str,
        status: int = 400,
        param: str | None = None,
        type_: str = "invalid_request_error",
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.param = param
        self.type = type_
        self.code = code

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }


@dataclass(slots=True)
class ParsedRequest:
    prompts: list[str | list[int]]  # one entry per choice (a completions prompt list)
    params: SamplingParams
    stream: bool
    include_usage: bool
    max_tokens_given: bool
    priority: int = 0  # vLLM's body field: lower is served first under priority scheduling


def _typed(body: dict[str, Any], name: str, types: tuple[type, ...], default: Any) -> Any:
    value = body.get(name, default)
    if value is None:
        return default
    # bool is an int subclass: never accept true/false where a number is meant
    if isinstance(value, bool) and bool not in types:
        raise APIError(f"'{name}' must be {_names(types)}, got a boolean", param=name)
    if not isinstance(value, types):
        raise APIError(f"'{name}' must be {_names(types)}, got {type(value).__name__}", param=name)
    return value


_TYPE_NAMES = {int: "an integer", float: "a number", bool: "a boolean", str: "a string",
               list: "a list", dict: "an object"}  # fmt: skip


def _number(body: dict[str, Any], name: str, default: float, lo: float, hi: float) -> float:
    """A float in [lo, hi] (hi included); JSON integers of any size are numbers too."""
    value = _typed(body, name, (int, float), default)
    try:
        value = float(value)
    except OverflowError:  # an integer of hundreds of digits
        digits = len(str(abs(value)))
        raise APIError(
            f"'{name}' must be in [{lo:g}, {hi:g}], got an integer of {digits} digits", param=name
        ) from None
    if not lo <= value <= hi:  # also refuses NaN
        raise APIError(f"'{name}' must be in [{lo:g}, {hi:g}], got {value}", param=name)
    return value


def _names(types: tuple[type, ...]) -> str:
    return " or ".join(_TYPE_NAMES[t] for t in types)


def _prompts(body: dict[str, Any]) -> list[str | list[int]]:
    prompt = body.get("prompt")
    if prompt is None:
        raise APIError("'prompt' is required", param="prompt")
    if isinstance(prompt, str):
        prompts: list[str | list[int]] = [prompt]
    elif isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
        prompts = list(prompt)
    elif isinstance(prompt, list) and prompt and all(_is_int(t) for t in prompt):
        prompts = [list(prompt)]
    elif (
        isinstance(prompt, list)
        and prompt
        and all(isinstance(p, list) and p and all(_is_int(t) for t in p) for p in prompt)
    ):
        prompts = [list(p) for p in prompt]
    else:
        raise APIError(
            "'prompt' must be a non-empty string, a list of strings, a list of token ids, "
            "or a list of token-id lists",
            param="prompt",
        )
    if any(p == "" for p in prompts):
        raise APIError("'prompt' must not be empty", param="prompt")
    for p in prompts:
        if isinstance(p, str):
            _check_text(p, "prompt")
    return prompts


def _check_text(text: str, param: str) -> None:
    try:
        check_unicode(text)
    except ValueError as e:
        raise APIError(f"'{param}': {e}", param=param) from e


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def parse_messages(body: dict[str, Any]) -> list[dict[str, str]]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise APIError("'messages' must be a non-empty list", param="messages")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ("system", "user", "assistant"):
            raise APIError(
                f"messages[{i}] needs a role of system, user or assistant", param="messages"
            )
        content = m.get("content")
        if isinstance(content, list):  # [{"type": "text", "text": ...}, ...]
            parts = [p.get("text") for p in content if isinstance(p, dict)]
            if not all(isinstance(p, str) for p in parts) or len(parts) != len(content):
                raise APIError(f"messages[{i}]: only text content is supported", param="messages")
            content = "".join(parts)
        if not isinstance(content, str):
            raise APIError(f"messages[{i}].content must be a string", param="messages")
        _check_text(content, "messages")
        out.append({"role": m["role"], "content": content})
    return out


def parse_common(body: dict[str, Any], prompts: list[str | list[int]], chat: bool) -> ParsedRequest:
    n = _typed(body, "n", (int,), 1)
    if not 1 <= n <= 256:
        raise APIError(f"'n' must be in [1, 256], got {n}", param="n")
    priority = _typed(body, "priority", (int,), 0)
    if not -(2**31) <= priority < 2**31:
        raise APIError(f"'priority' must fit in 32 bits, got {priority}", param="priority")
    if body.get("logprobs") not in (None, False) or body.get("top_logprobs") is not None:
        raise APIError("logprobs are not supported", param="logprobs")
    if body.get("echo"):
        raise APIError("echo is not supported", param="echo")
    if body.get("best_of") not in (None, 1):
        raise APIError("best_of is not supported", param="best_of")
    # Fields that would change the reply's meaning are refused, never ignored (vLLM refuses
    # suffix too); fields that only label a request (user) pass.
    if body.get("suffix"):
        raise APIError("suffix is not supported", param="suffix")
    fmt = body.get("response_format")
    if fmt is not None and not (isinstance(fmt, dict) and fmt.get("type") == "text"):
        raise APIError(
            "response_format other than {'type': 'text'} is not supported (no structured output)",
            param="response_format",
        )
    if body.get("tools") and body.get("tool_choice", "auto") != "none":
        raise APIError("tool calls are not supported (tool_choice 'none' is)", param="tools")
    names = ("max_completion_tokens", "max_tokens") if chat else ("max_tokens",)
    max_tokens = None
    for name in names:
        max_tokens = _typed(body, name, (int,), None)
        if max_tokens is not None:
            if max_tokens < 1:
                raise APIError(f"'{name}' must be at least 1, got {max_tokens}", param=name)
            break
    temperature = _number(body, "temperature", 1.0, 0.0, 2.0)
    top_p = _number(body, "top_p", 1.0, 0.0, 1.0)
    if top_p == 0.0:
        raise APIError("'top_p' must be in (0, 1], got 0", param="top_p")
    top_k = _typed(body, "top_k", (int,), 0)
    if top_k < -1:
        raise APIError(f"'top_k' must be -1 (off), 0 (off) or positive, got {top_k}", param="top_k")
    top_k = min(top_k, 2**31 - 1)  # beyond any vocabulary (no cut), and it fits a tensor
    seed = _typed(body, "seed", (int,), None)
    if seed is not None and not -(2**63) <= seed < 2**64:
        raise APIError(f"'seed' must fit in 64 bits, got {seed}", param="seed")
    stop = body.get("stop")
    if stop is None:
        stop = []
    elif isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop):
        raise APIError("'stop' must be a non-empty string or a list of them", param="stop")
    try:
        check_stops(stop)
    except ValueError as e:
        raise APIError(f"'stop': {e}", param="stop") from e
    stop_token_ids = _typed(body, "stop_token_ids", (list,), [])
    if not all(_is_int(t) for t in stop_token_ids):
        raise APIError("'stop_token_ids' must be a list of integers", param="stop_token_ids")
    min_tokens = _typed(body, "min_tokens", (int,), 0)
    # Chat without max_tokens gets what the context leaves (the server sets it later).
    default_max = max(16, min_tokens) if chat else 16
    if not 0 <= min_tokens <= (max_tokens or default_max):
        raise APIError(
            f"'min_tokens' must be in [0, max_tokens={max_tokens or 16}], got {min_tokens}",
            param="min_tokens",
        )
    repetition_penalty = _number(body, "repetition_penalty", 1.0, 0.0, math.inf)
    if not 0.0 < repetition_penalty < math.inf:
        raise APIError(
            f"'repetition_penalty' must be greater than zero and finite, got {repetition_penalty}",
            param="repetition_penalty",
        )
    stream = _typed(body, "stream", (bool,), False)
    stream_options = _typed(body, "stream_options", (dict,), {})
    try:
        params = SamplingParams(
            max_tokens=max_tokens or default_max,
            temperature=temperature,
            top_p=top_p,
            top_k=top_k,
            seed=seed,
            stop=stop,
            stop_token_ids=stop_token_ids,
            n=n,
            ignore_eos=_typed(body, "ignore_eos", (bool,), False),
            include_stop_str_in_output=_typed(body, "include_stop_str_in_output", (bool,), False),
            logit_bias=_logit_bias(body),
            min_tokens=min_tokens,
            presence_penalty=_number(body, "presence_penalty", 0.0, -2.0, 2.0),
            frequency_penalty=_number(body, "frequency_penalty", 0.0, -2.0, 2.0),
            repetition_penalty=repetition_penalty,
            min_p=_number(body, "min_p", 0.0, 0.0, 1.0),
        )
    except ValueError as e:  # a check SamplingParams makes that the lines above do not
        raise APIError(str(e)) from e
    include_usage = stream_options.get("include_usage", False)
    if not isinstance(include_usage, bool):
        raise APIError("'stream_options.include_usage' must be a boolean", param="stream_options")
    return ParsedRequest(prompts, params, stream, include_usage, max_tokens is not None, priority)


def _logit_bias(body: dict[str, Any]) -> dict[int, float] | None:
    """OpenAI's map of token id (a JSON key, so a string) to a bias, clamped to [-100, 100]
    as vLLM does; ids past the vocabulary are refused by the server, which knows it."""
    raw = _typed(body, "logit_bias", (dict,), None)
    if not raw:
        return None
    bias = {}
    for key, value in raw.items():
        try:
            token = int(key)
        except ValueError:
            token = -1
        if token < 0:
            raise APIError(
                f"'logit_bias' keys must be token ids, got {key[:40]!r}", param="logit_bias"
            )
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise APIError(
                f"'logit_bias' values must be numbers, got {type(value).__name__}",
                param="logit_bias",
            )
        try:
            bias[token] = min(100.0, max(-100.0, float(value)))
        except OverflowError:  # an integer of hundreds of digits
            bias[token] = 100.0 if value > 0 else -100.0
        if math.isnan(bias[token]):
            raise APIError("'logit_bias' values must be numbers, got NaN", param="logit_bias")
    return bias


def check_logit_bias(params: SamplingParams, vocab: int) -> None:
    if params.logit_bias and max(params.logit_bias) >= vocab:
        msg = f"'logit_bias' has token ids past the vocabulary ({vocab})"
        raise APIError(msg, param="logit_bias")


def parse_completion(body: dict[str, Any]) -> ParsedRequest:
    return parse_common(body, _prompts(body), chat=False)
