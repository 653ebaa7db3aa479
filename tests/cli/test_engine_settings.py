"""Engine settings are declared once (a field of engine.config's dataclasses, with its type,
default and help); every command's options, validation of choices and the server's /metrics
labels are derived from that declaration (issue 42)."""

from __future__ import annotations

import inspect
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import pytest
import typer
from typer.testing import CliRunner

import bench_cli.engine_options as engine_options_module
from bench_cli.app import app
from bench_cli.engine_options import engine_options, option_help
from engine.config import ENGINE_SETTINGS, EngineConfig, setting, settings_of

ROOT = Path(__file__).resolve().parents[2]


def _options(command: str) -> dict[str, Any]:
    click_app = typer.main.get_command(app)
    return {p.name: p for p in click_app.commands[command].params}  # type: ignore[attr-defined]


@pytest.mark.parametrize("command", ["serve", "generate", "run"])
def test_every_setting_is_an_option_of_each_command_that_starts_the_engine(command: str) -> None:
    options = _options(command)
    for name, spec in ENGINE_SETTINGS.items():
        assert name in options, (command, name)
        if name != "seed":  # run's and generate's seed seeds more than the engine
            assert spec.help in options[name].help, (command, name)


def test_serve_takes_each_default_from_the_declaration() -> None:
    options = _options("serve")
    for name, spec in ENGINE_SETTINGS.items():
        default = options[name].default
        assert default == spec.default, name


def test_run_leaves_every_setting_to_its_profile_unless_given() -> None:
    options = _options("run")
    assert all(options[n].default is None for n in ENGINE_SETTINGS if n != "seed")
    assert options["max_num_seqs"].help.startswith("engine: ")


def test_no_engine_setting_is_declared_again_in_the_cli() -> None:
    """The commands that start the engine take its settings from the decorator only."""
    starting = {c.callback.__name__: c.callback for c in app.registered_commands}
    starting = {n: f for n, f in starting.items() if hasattr(f, "__wrapped__")}
    assert set(starting) == {"generate", "serve", "run", "calibrate", "profile"}
    for name, command in starting.items():
        source = inspect.getsource(command.__wrapped__)
        head = source[: source.index(") -> None:")]  # the parameters
        for setting_name in ENGINE_SETTINGS:
            if setting_name != "seed":
                assert not re.search(rf"^\s+{setting_name}: ", head, re.M), (name, setting_name)


@pytest.mark.parametrize("name", [n for n, s in ENGINE_SETTINGS.items() if s.choices])
def test_validation_refuses_what_a_literal_does_not_list(name: str) -> None:
    cfg = EngineConfig()
    setattr(cfg.holder(name), name, "no-such-value")
    with pytest.raises(ValueError, match=rf"^{name} must be '"):
        cfg.validate()


def test_the_server_labels_every_setting() -> None:
    cfg = EngineConfig.from_kwargs("tiny", max_num_seqs=3, kv_reservation="max_len")
    flat = cfg.flat()
    assert set(flat) == set(ENGINE_SETTINGS)
    assert flat["max_num_seqs"] == 3 and flat["kv_reservation"] == "max_len"
    source = (ROOT / "engine" / "serving" / "server.py").read_text()
    assert "cfg.flat()" in source  # build_app labels /metrics with every setting


# -- adding a setting: one field, and it reaches the CLI and validation ---------------------


@dataclass(slots=True)
class ToySection:
    toy_knob: Literal["low", "high"] = setting("low", "a toy setting")
    toy_count: int | None = setting(None, "a toy count")


def test_a_new_field_becomes_a_setting_with_its_choices() -> None:
    toys = settings_of({"toy": ToySection})
    assert toys["toy_knob"].choices == ("low", "high") and toys["toy_knob"].default == "low"
    assert toys["toy_count"].optional and not toys["toy_count"].choices
    assert option_help(toys["toy_knob"]) == "low | high: a toy setting"


def test_a_new_setting_reaches_a_commands_options(monkeypatch: pytest.MonkeyPatch) -> None:
    toys = settings_of({"toy": ToySection})
    monkeypatch.setattr(engine_options_module, "ENGINE_SETTINGS", ENGINE_SETTINGS | toys)
    seen: dict[str, Any] = {}
    toy_app = typer.Typer()

    @toy_app.command()
    @engine_options(("toy_knob", "toy_count", "max_num_seqs"), unset=True)
    def go(name: str = "x", *, engine: dict[str, Any]) -> None:
        seen.update(engine, name=name)

    runner = CliRunner()
    result = runner.invoke(toy_app, ["--toy-knob", "high", "--max-num-seqs", "4"])
    assert result.exit_code == 0, result.output
    assert seen == {"toy_knob": "high", "max_num_seqs": 4, "name": "x"}  # unset: not given
    help_text = runner.invoke(toy_app, ["--help"]).output
    assert "--toy-knob" in help_text and "low | high: a toy setting" in help_text
    assert "--toy-count" in help_text
