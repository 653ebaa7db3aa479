"""Engine settings from `EngineConfig` and its parts (one home for each setting: its field's
type, default, help and the comments beside it), with the `bench serve` flag that sets it
(generated from the same field: bench_cli/engine_options.py); and the
bundled profiles (profiles/*.toml) with their leading comments."""

from __future__ import annotations

import tomllib
from pathlib import Path

import typer.main
from typer._click.core import Context

from bench_cli.app import app
from engine.config import ENGINE_SETTINGS, CacheConfig, EngineConfig, SchedulerConfig
from scripts.docgen.markdown import code, page, table
from scripts.docgen.source import field_comments

PROFILES = Path(__file__).resolve().parents[2] / "profiles"


def _serve_flags() -> dict[str, tuple[str, str]]:
    group = typer.main.get_command(app)
    root = Context(group, info_name="bench")
    serve = group.get_command(root, "serve")
    ctx = Context(serve, info_name="serve", parent=root)
    return {p.name: p.get_help_record(ctx) for p in serve.params if p.get_help_record(ctx)}


def settings_page() -> str:
    flags = _serve_flags()
    sections = []
    parts = (
        (EngineConfig, "engine", "`EngineConfig`: the model, its numerics and its kernels."),
        (SchedulerConfig, "scheduler", "`SchedulerConfig`: what runs in each step."),
        (CacheConfig, "cache", "`CacheConfig`: the paged KV cache."),
    )
    for cls, key, what in parts:
        comments = field_comments(cls)
        rows = []
        for spec in (s for s in ENGINE_SETTINGS.values() if s.section == key):
            flag = flags.get(spec.name, ("-", ""))[0]
            meaning = ". ".join(t for t in (spec.help, comments.get(spec.name, "")) if t)
            choices = " | ".join(repr(c) for c in spec.choices)
            rows.append((code(spec.name), code(repr(spec.default)), choices, meaning, code(flag)))
        doc = f" (recorded under `engine.{key}`)" if key != "engine" else ""
        sections.append(
            f"## {key}\n\n{what}{doc}\n\n"
            + table(["setting", "default", "choices", "meaning (engine/config.py)", "flag"], rows)
        )
    intro = (
        "Every engine setting, from the dataclasses in engine/config.py. The same name is an "
        "argument of `LLM(...)` and `EngineConfig.from_kwargs`, a `bench serve` / `bench run` "
        "flag (dashes for underscores) and a profile key; `None` defaults are resolved from "
        "the model at start-up, and the resolved values are what config.json and "
        "`GET /v1/engine/config` record. `speculative_config` takes vLLM's JSON: "
        '`{"method": "ngram", "num_speculative_tokens": 4}`.'
    )
    return page("Engine settings", "engine/config.py", intro, "\n".join(sections))


def profiles_page() -> str:
    rows = []
    for path in sorted(PROFILES.glob("*.toml")):
        text = path.read_text()
        lead = []
        for line in text.splitlines():
            if not line.startswith("#"):
                break
            lead.append(line.lstrip("#").strip())
        data = tomllib.loads(text)
        axes = ", ".join(data.get("sweep", {})) or "-"
        rows.append((code(path.stem), " ".join(lead), axes))
    intro = (
        "The bundled profiles (profiles/*.toml), with what each file's opening comment says. "
        "`bench run --profile NAME` and `bench sweep --profile NAME` take a name or any path; "
        "keys are the flag names with underscores, and a `[sweep]` table's keys are the "
        "sweep's axes."
    )
    return page(
        "Profiles", "profiles/*.toml", intro, table(["profile", "what it is", "sweep axes"], rows)
    )
