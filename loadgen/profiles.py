"""A run's profile (TOML, the same keys as `bench run`'s flags, with underscores) overlaid by
the flags given, into one RunConfig."""

from __future__ import annotations

import dataclasses
import json
import tomllib
from pathlib import Path
from typing import Any

from loadgen.arrivals import param_fields, param_type
from loadgen.arrivals.settings import (
    is_foreign,
)
from loadgen.config import RunConfig
from loadgen.redact import parse_header
from loadgen.traffic import parse_class_flag, resolve_classes

PROFILE_DIR = Path(__file__).resolve().parent.parent / "profiles"
# A profile key is dropped when a flag gives one of the keys it maps to: `--concurrency 8`
# over a Poisson profile is a closed loop (not Poisson capped at 8) unless --rate is given
# too; `--duration 60` is not also cut at the profile's request count (nor the other way
# round); a trace is replayed whole at its own times and lengths, and a dataset gives its
# own prompts and output lengths, unless the flags say otherwise.
DROPPED_BY = {
    "arrival": ("trace",),
    "rate": ("concurrency", "trace", "ramp_up_strategy"),
    "num_requests": ("duration", "trace"),
    "duration": ("num_requests", "trace"),
    "input_len": ("trace", "dataset"),
    "output_len": ("trace", "dataset"),
}


def load_profile(name_or_path: str) -> dict[str, Any]:
    """A profile by name (profiles/NAME.toml) or path, as flat keys."""
    path = Path(name_or_path)
    if not path.is_file():
        path = PROFILE_DIR / f"{name_or_path}.toml"
    if not path.is_file():
        known = sorted(p.stem for p in PROFILE_DIR.glob("*.toml"))
        raise ValueError(f"profile {name_or_path!r}: no such file; known profiles: {known}")
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as e:
        raise ValueError(f"profile {path}: {e}") from e
    data.setdefault("name", path.stem)
    _resolve_data_paths(data, path.parent)
    for values in (data.get("sweep") or {}).values():  # bundles of a sweep axis
        for bundle in values if isinstance(values, list) else ():
            if isinstance(bundle, dict):
                _resolve_data_paths(bundle, path.parent)
    return data


def _resolve_data_paths(keys: dict[str, Any], base: Path) -> None:
    """A profile's dataset or trace file may be named relative to the profile itself
    (profiles/data/...): such a path becomes absolute when no file of that name is found
    relative to the working directory."""
    for key in ("dataset", "trace"):
        value = keys.get(key)
        if not isinstance(value, str):
            continue
        prefix, _, name = value.rpartition(":") if key == "dataset" else ("", "", value)
        if name and not Path(name).exists() and (base / name).exists():
            resolved = str((base / name).resolve())
            keys[key] = f"{prefix}:{resolved}" if prefix else resolved


def build_config(
    profile: dict[str, Any], flags: dict[str, Any], engine_names: set[str]
) -> RunConfig:
    """Defaults < profile < flags given (None: not given), less the profile keys a flag
    makes moot (DROPPED_BY). Engine settings (any key that is an engine argument) go to
    `engine`; an unknown key is an error naming it."""
    names = setting_names()
    profile, flags = dict(profile), dict(flags)
    class_tables = profile.pop("class", None)
    if flags.get("classes") is not None:  # --class replaces the profile's classes
        class_tables = [parse_class_flag(text) for text in flags["classes"]]
    flags.pop("classes", None)
    given = {k for k, v in flags.items() if v is not None}
    profile = {k: v for k, v in profile.items() if given.isdisjoint(DROPPED_BY.get(k, ()))}
    if "trace" in given and "arrival" not in given:
        flags = flags | {"arrival": "trace"}  # --trace FILE alone replays the trace
    if flags.get("arrival") is not None:  # the profile's trace, or shape, is not used
        profile = {k: v for k, v in profile.items() if not is_foreign(k, flags["arrival"])}
    cfg = RunConfig()
    for source, values in (("profile", profile), ("flag", flags)):
        for key, value in values.items():
            if value is None:
                continue
            if key == "engine" and isinstance(value, str):  # `engine = "sim"`, as the flag
                key = "engine_kind"
            if key not in names and key not in engine_names:
                raise ValueError(f"{source} key {key!r} is not a setting of bench run")
            if key in param_fields():
                cfg.arrival_params[key] = _coerce(key, value)
            elif key in names:  # `seed` is both: it seeds the run and the engine
                setattr(cfg, key, _coerce(key, value))
            if key in engine_names:
                cfg.engine[key] = value
    for key in [k for k in cfg.arrival_params if k not in given and is_foreign(k, cfg.arrival)]:
        del cfg.arrival_params[key]  # a gamma profile's shape, moot once --arrival changes it
    if class_tables is not None:
        cfg._validate_classes()  # before the classes inherit a trace or a closed loop
        cfg.classes = resolve_classes(class_tables, cfg.flat())
    cfg.validate()
    return cfg


def setting_names() -> set[str]:
    """The keys of bench run a profile or flag may set (engine settings aside)."""
    fields = {f.name for f in dataclasses.fields(RunConfig)}
    return fields - {"engine", "classes", "arrival_params"} | set(param_fields())


def _coerce(key: str, value: Any) -> Any:
    """Profiles may write lengths as numbers and rates as integers; headers come as a table
    or as `K=V` flags, an extra body as a table or as JSON text."""
    if key in ("input_len", "output_len", "turns"):
        return str(value)
    if key == "workers":
        from loadgen.split_runner import parse_workers

        return parse_workers(value)
    if key == "headers":
        return value if isinstance(value, dict) else dict(parse_header(h) for h in value)
    if key == "extra_body":
        return value if isinstance(value, dict) else _json_object(value)
    if key in param_fields():
        return param_type(key)(value)
    if key in (
        "rate",
        "duration",
        "timeout",
        "max_p99_lag_ms",
        "telemetry_interval",
        "temperature",
        "top_p",
        "ramp_up_start_rps",
        "think_time",
        "ramp_up_end_rps",
    ):
        return float(value)
    return value


def _json_object(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError as e:
        raise ValueError(f"--extra-body {text!r}: not JSON: {e}") from None
    if not isinstance(value, dict):
        raise ValueError(
            f"--extra-body {text!r}: expected a JSON object, e.g. '{{\"min_p\": 0.1}}'"
        )
    return value
