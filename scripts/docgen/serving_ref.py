"""The bundled server's HTTP API: its routes (engine/serving/server.py), the request-body
fields it reads (engine/serving/protocol.py, completions.py), and its /metrics names
(engine/serving/info_routes.py), each read from the code that handles them."""

from __future__ import annotations

import ast
import inspect

from engine.serving import completions, info_routes, protocol, server
from engine.serving.metrics import process_metrics
from scripts.docgen.markdown import code, page, table

# Body fields of OpenAI's own API; every other field the server reads is an extension (vLLM's).
OPENAI_FIELDS = {
    "model", "prompt", "messages", "max_tokens", "max_completion_tokens", "temperature",
    "top_p", "n", "stream", "stream_options", "stop", "seed", "presence_penalty",
    "frequency_penalty", "logit_bias", "logprobs", "top_logprobs", "echo", "best_of",
    "suffix", "response_format", "tools", "tool_choice", "user",
}  # fmt: skip


def _calls(module: object) -> list[ast.Call]:
    return [n for n in ast.walk(ast.parse(inspect.getsource(module))) if isinstance(n, ast.Call)]


def routes() -> list[tuple[str, str, str]]:
    out = []
    for call in _calls(server):
        name = ast.unparse(call.func)
        if name.startswith("app.router.add_") and len(call.args) == 2:
            method = name.removeprefix("app.router.add_").upper()
            path = call.args[0].value  # type: ignore[attr-defined]
            handler = getattr(server, ast.unparse(call.args[1]))
            out.append((method, path, " ".join((handler.__doc__ or "").split())))
    return out


def body_fields() -> dict[str, str]:
    """Each field the parser reads, with its default and range where the code gives them."""
    fields: dict[str, str] = {}
    for call in _calls(protocol) + _calls(completions):
        func = ast.unparse(call.func)
        args = call.args
        if func in ("_typed", "_number") and len(args) >= 3 and isinstance(args[1], ast.Constant):
            name, default = args[1].value, ast.unparse(args[-3 if func == "_number" else -1])
            what = f"default {default}"
            if func == "_number":
                what += f", in [{ast.unparse(args[3])}, {ast.unparse(args[4])}]"
            fields.setdefault(name, what)
        elif func == "body.get" and isinstance(args[0], ast.Constant):
            fields.setdefault(args[0].value, "")
    for call in _calls(protocol):
        if ast.unparse(call.func) == "APIError" and call.args:
            message, param = call.args[0], {k.arg: k.value for k in call.keywords}.get("param")
            constants = isinstance(message, ast.Constant) and isinstance(param, ast.Constant)
            if constants and "not supported" in str(message.value):  # type: ignore[union-attr]
                fields[param.value] = f"refused (400): {message.value}"  # type: ignore[union-attr]
    fields.setdefault("max_completion_tokens", "chat: the same as max_tokens")
    return fields


def _source(module: object) -> str:
    return inspect.getsource(module)  # type: ignore[arg-type]


def api_page() -> str:
    routes_table = table(["method", "path", "what it does"], routes())
    fields = body_fields()
    rows = [
        (code(name), "OpenAI" if name in OPENAI_FIELDS else "extension (vLLM's)", what)
        for name, what in sorted(fields.items())
    ]
    body = (
        f"## Routes\n\n{routes_table}\n## Request body fields\n\n"
        "`POST /v1/completions` takes `prompt` (a string, a list of strings, token ids or lists "
        "of them); `POST /v1/chat/completions` takes `messages`. Every field read by "
        "engine/serving/protocol.py:\n\n"
        + table(["field", "from", "how it is read"], rows)
        + '\nA bad body gets a 4xx with an OpenAI-style `{"error": {...}}` body; an unknown '
        "model 404 `model_not_found`. Streams are SSE `data:` chunks ending in "
        "`data: [DONE]`; `stream_options.include_usage` adds a final usage chunk with "
        "`prompt_tokens_details.cached_tokens`.\n"
    )
    intro = (
        "`bench serve` speaks the OpenAI API, as vLLM's server does; the extensions are vLLM's "
        "names, applied as vLLM applies them. With `--api-key KEY` (or "
        "`SERVEBENCH_API_KEY`) every `/v1/...` route needs `Authorization: Bearer KEY`; "
        "`/health` and `/metrics` stay open."
    )
    return page("OpenAI API", "engine/serving/server.py, completions.py, protocol.py", intro, body)


def server_metrics() -> list[tuple[str, str, str]]:
    """(name, type, help) of every `servebench:` sample the /metrics handler writes."""
    out = []
    for node in ast.walk(ast.parse(inspect.getsource(info_routes.metrics))):
        if not isinstance(node, ast.Dict):
            continue
        for key, value in zip(node.keys, node.values, strict=True):
            if not (isinstance(key, ast.Constant) and isinstance(value, ast.Tuple)):
                continue
            parts = value.elts
            help_ = parts[-1]
            kind = parts[0].value if len(parts) == 3 else "histogram"  # type: ignore[attr-defined]
            text = help_.value if isinstance(help_, ast.Constant) else ast.unparse(help_)
            name = f"servebench:{key.value}"
            if kind == "histogram":
                name += "_bucket / _sum / _count"
            out.append((name, kind, text))
    return out


def prometheus_page() -> str:
    rows = [(code(n), k, h) for n, k, h in server_metrics()]
    rows.append(
        (code("servebench:config{...}"), "gauge", "the engine's resolved settings as labels")
    )
    for line in process_metrics():
        if line.startswith("# HELP "):
            name, _, help_ = line.removeprefix("# HELP ").partition(" ")
            rows.append((code(name), "process", help_))
    intro = (
        "`GET /metrics` of `bench serve`, in Prometheus' text format, read from its handler in "
        "engine/serving/info_routes.py. vLLM's names with our `servebench:` prefix where vLLM has "
        "one; `bench run` scrapes these (or vLLM's, SGLang's, llama.cpp's) into timeline.csv "
        "([result files](result-files.md#timelinecsv))."
    )
    return page(
        "/metrics", "engine/serving/info_routes.py", intro, table(["name", "type", "meaning"], rows)
    )
