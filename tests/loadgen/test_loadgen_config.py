"""A run's configuration: profiles, the defaults < profile < flags overlay, engine settings,
validation and the recorded form."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from engine.config import engine_arg_names
from loadgen.config import RunConfig
from loadgen.profiles import PROFILE_DIR, build_config, load_profile

ENGINE = {"max_num_seqs", "batching"}
BASE = {"rate": 2.0, "num_requests": 10}  # the least a valid open-loop run needs


def build(profile: dict[str, Any] | None = None, **flags: Any) -> RunConfig:
    return build_config(profile if profile is not None else dict(BASE), flags, ENGINE)


# ---- profiles ---------------------------------------------------------------------------------


def test_default_profile_is_read_by_name() -> None:
    profile = load_profile("default")
    assert profile["name"] == "default"
    assert (profile["arrival"], profile["rate"], profile["num_requests"]) == ("poisson", 0.5, 50)
    cfg = build_config(profile, {}, engine_arg_names())
    assert (cfg.name, cfg.rate, cfg.input_len, cfg.output_len) == (
        "default",
        0.5,
        "uniform:64:256",
        "64",
    )


def test_profile_by_path_is_named_after_its_file(tmp_path: Path) -> None:
    path = tmp_path / "nightly.toml"
    path.write_text("rate = 3\nnum_requests = 7\ninput_len = 512\n")
    assert load_profile(str(path)) == {
        "name": "nightly",
        "rate": 3,
        "num_requests": 7,
        "input_len": 512,
    }
    path.write_text('name = "mine"\nrate = 3\n')
    assert load_profile(str(path))["name"] == "mine"


def test_missing_profile_lists_the_known_ones() -> None:
    known = sorted(p.stem for p in PROFILE_DIR.glob("*.toml"))
    assert "default" in known
    with pytest.raises(ValueError, match=r"'no-such-profile'.*known profiles.*'default'") as e:
        load_profile("no-such-profile")
    assert str(known) in str(e.value)


def test_bad_toml_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "broken.toml"
    path.write_text("rate = = 2\n")
    with pytest.raises(ValueError, match=re.escape(str(path))):
        load_profile(str(path))


# ---- the overlay ------------------------------------------------------------------------------


def test_defaults_then_profile_then_flags() -> None:
    profile = {"rate": 2, "num_requests": 10, "input_len": "uniform:1:9", "seed": 3}
    cfg = build(profile, rate=5.0, num_requests=None, output_len="17", warmup=None)
    assert cfg.rate == 5.0  # the flag wins
    assert cfg.num_requests == 10  # a flag of None was not given
    assert cfg.input_len == "uniform:1:9"  # the profile's
    assert cfg.output_len == "17"  # the flag's over the default
    assert cfg.seed == 3
    # No model yet: `bench run` picks the bundled default or the server's first listed one.
    assert (cfg.warmup, cfg.model, cfg.arrival, cfg.endpoint) == (0, None, "poisson", "completions")
    assert cfg.engine == {}


def test_defaults_are_kept_without_a_profile() -> None:
    cfg = build_config({}, {"rate": 1, "duration": 30}, ENGINE)
    expected = RunConfig(rate=1.0, duration=30.0)
    assert cfg == expected


def test_engine_settings_go_to_engine() -> None:
    cfg = build({**BASE, "max_num_seqs": 8, "batching": "static"}, max_num_seqs=16, batching=None)
    assert cfg.engine == {"max_num_seqs": 16, "batching": "static"}


def test_real_engine_argument_names_go_to_engine() -> None:
    flags = {"max_num_seqs": 4, "block_size": 32, "enable_chunked_prefill": False, "dtype": None}
    cfg = build_config(dict(BASE), flags, engine_arg_names())
    assert cfg.engine == {"max_num_seqs": 4, "block_size": 32, "enable_chunked_prefill": False}


def test_seed_flag_seeds_the_run_with_the_real_engine_names() -> None:
    cfg = build_config(load_profile("default"), {"seed": 5}, engine_arg_names())
    assert cfg.seed == 5


@pytest.mark.parametrize(
    ("profile", "flags", "message"),
    [
        ({**BASE, "ratee": 2}, {}, "profile key 'ratee'"),
        (BASE, {"num_request": 3}, "flag key 'num_request'"),
        (BASE, {"engine": {"max_num_seqs": 2}}, "flag key 'engine'"),
        ({**BASE, "block_size": 16}, {}, "profile key 'block_size'"),  # not in ENGINE here
    ],
)
def test_unknown_keys_are_named_with_their_source(
    profile: dict[str, Any], flags: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        build_config(profile, flags, ENGINE)


def test_unknown_none_flag_is_ignored() -> None:
    """A flag of None was not given, whatever its name."""
    assert build(num_request=None).num_requests == 10


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        ("input_len", 128, "128"),
        ("output_len", 64, "64"),
        ("input_len", "uniform:1:5", "uniform:1:5"),
        ("rate", 3, 3.0),
        ("duration", 60, 60.0),
        ("burstiness", 2, 2.0),
        ("timeout", 30, 30.0),
    ],
)
def test_profile_values_are_coerced(key: str, value: Any, expected: Any) -> None:
    got = getattr(build({**BASE, "arrival": "gamma", key: value}), key)
    assert got == expected
    assert type(got) is type(expected)


@pytest.mark.parametrize(
    ("flags", "closed"),
    [
        ({"concurrency": 4}, True),
        ({"concurrency": 4, "rate": 2.0}, False),
        ({"rate": 2.0}, False),
        ({"concurrency": 4, "arrival": "trace", "trace": "t.jsonl"}, False),
    ],
)
def test_closed_loop(flags: dict[str, Any], closed: bool) -> None:
    assert build_config({"num_requests": 5}, flags, ENGINE).closed_loop is closed


def test_an_arrival_flag_replaces_the_profiles_arrival_group() -> None:
    """`--concurrency 8` over a Poisson profile is a closed loop, not Poisson capped at 8."""
    cfg = build_config(load_profile("default"), {"concurrency": 8}, ENGINE)
    assert (cfg.rate, cfg.concurrency, cfg.closed_loop) == (None, 8, True)
    assert cfg.num_requests == 50  # the other group is the profile's
    cfg = build_config(load_profile("default"), {"concurrency": 8, "rate": 1.0}, ENGINE)
    assert (cfg.rate, cfg.concurrency, cfg.closed_loop) == (1.0, 8, False)


@pytest.mark.parametrize(
    ("flags", "num_requests", "duration"),
    [({"duration": 60}, None, 60.0), ({"num_requests": 5}, 5, None), ({}, 50, None)],
)
def test_a_stop_flag_replaces_the_profiles_stop_group(
    flags: dict[str, Any], num_requests: int | None, duration: float | None
) -> None:
    cfg = build_config(load_profile("default"), flags, ENGINE)
    assert (cfg.num_requests, cfg.duration, cfg.rate) == (num_requests, duration, 0.5)


@pytest.mark.parametrize(
    ("profile", "flags"),
    [
        (
            {"arrival": "trace", "trace": "t.jsonl", "trace_format": "mooncake"},
            {"time_scale": 0.5},
        ),
        ({"arrival": "gamma", "rate": 2.0, "num_requests": 5}, {"burstiness": 0.5}),
    ],
)
def test_a_modifier_flag_keeps_the_profiles_arrival(
    profile: dict[str, Any], flags: dict[str, Any]
) -> None:
    cfg = build_config(profile, flags, ENGINE)
    assert cfg.arrival == profile["arrival"]


# ---- validation -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        ({"num_requests": 5}, "poisson arrivals need --rate"),
        ({"num_requests": 5, "arrival": "gamma"}, "gamma arrivals need --rate"),
        ({"rate": 1.0, "num_requests": 5, "arrival": "bursty"}, "arrival 'bursty'"),
        ({"arrival": "trace"}, "needs --trace FILE"),
        ({"arrival": "trace", "trace": "t.csv", "trace_format": "csv"}, "trace format 'csv'"),
        ({"rate": 1.0}, "--num-requests N and/or --duration S"),
        ({"rate": 1.0, "num_requests": 5, "warmup": -1}, "warmup must be >= 0"),
        ({"concurrency": 0, "num_requests": 5}, "concurrency must be >= 1"),
        ({"rate": 1.0, "num_requests": 0}, "num_requests must be >= 1"),
        ({"rate": 1.0, "duration": 0}, "duration must be > 0"),
        ({"rate": 1.0, "duration": -5}, "duration must be > 0"),
        ({**BASE, "in_process": True, "base_url": "http://h/v1"}, "cannot go with --base-url"),
        (
            {"arrival": "trace", "trace": "t.jsonl", "dataset": "sg.json"},
            "cannot go with --arrival trace",
        ),
        ({**BASE, "endpoint": "embeddings"}, "endpoint 'embeddings'"),
    ],
)
def test_invalid_configs_are_refused(flags: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        build_config({}, flags, ENGINE)


@pytest.mark.parametrize(
    "flags",
    [
        {"arrival": "trace", "trace": "t.jsonl"},  # a trace gives its own count
        {"rate": 1.0, "duration": 0.5, "warmup": 0},
        {"concurrency": 1, "num_requests": 1},
        {**BASE, "in_process": True},
        {**BASE, "base_url": "http://h/v1", "endpoint": "chat", "dataset": "sg.json"},
        {"arrival": "trace", "trace": "b.csv", "trace_format": "burstgpt"},
    ],
)
def test_valid_configs_pass(flags: dict[str, Any]) -> None:
    build_config({}, flags, ENGINE)


def test_validation_runs_after_the_overlay() -> None:
    """A profile missing the rate is fine when the flags give one (and the reverse)."""
    assert build_config({"num_requests": 3}, {"rate": 1.0}, ENGINE).rate == 1.0
    with pytest.raises(ValueError, match="concurrency"):
        build_config({**BASE, "concurrency": 2}, {"concurrency": 0}, ENGINE)


# ---- the recorded form ------------------------------------------------------------------------


def test_to_dict_masks_the_api_key() -> None:
    cfg = build(api_key="sk-secret", max_num_seqs=8)
    d = cfg.to_dict()
    assert d["api_key"] == "***"
    assert "sk-secret" not in repr(d)
    assert cfg.api_key == "sk-secret"  # the config itself keeps it
    assert d["engine"] == {"max_num_seqs": 8}
    assert (d["rate"], d["num_requests"], d["name"]) == (2.0, 10, "run")


def test_to_dict_without_an_api_key() -> None:
    assert build().to_dict()["api_key"] is None


def test_a_trace_flag_replays_the_whole_trace_and_a_dataset_its_own_lengths() -> None:
    flags = {"arrival": "trace", "trace": "t.jsonl"}
    cfg = build_config(load_profile("default"), flags, ENGINE)
    assert (cfg.num_requests, cfg.duration) == (None, None)
    cfg = build_config(load_profile("default"), {"dataset": "sharegpt:x.json"}, ENGINE)
    assert cfg.output_len is None  # the replies' lengths, not the profile's 64


# ---- no flag is silently ignored (issue 17, defect 4) -----------------------------------------


def test_a_trace_flag_alone_replays_the_trace_over_a_poisson_profile() -> None:
    """Before, `--trace FILE` without `--arrival trace` ran the profile's Poisson load while
    config.json recorded the trace."""
    cfg = build_config(load_profile("default"), {"trace": "t.jsonl"}, ENGINE)
    assert (cfg.arrival, cfg.trace, cfg.rate, cfg.input_len, cfg.output_len) == (
        "trace",
        "t.jsonl",
        None,
        None,
        None,
    )


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        ({"arrival": "poisson", "rate": 1.0, "num_requests": 5, "trace": "t.jsonl"}, "not poisson"),
        ({"trace": "t.jsonl", "input_len": "64"}, "--input-len cannot go with it"),
        ({"trace": "t.jsonl", "rate": 2.0}, "use --time-scale, not --rate"),
        ({**BASE, "dataset": "sharegpt:x.json", "input_len": "64"}, "--input-len cannot go"),
        ({**BASE, "burstiness": 0.5}, "--burstiness shapes gamma arrivals; poisson has none"),
    ],
)
def test_a_flag_that_would_be_ignored_is_refused(flags: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        build_config(load_profile("default"), flags, ENGINE)


def test_the_recorded_config_says_what_was_used() -> None:
    """A gamma profile's shape does not survive `--arrival poisson`; a trace profile's file
    does not survive `--arrival constant`; the default lengths are not claimed for a trace."""
    gamma = {**BASE, "arrival": "gamma", "burstiness": 0.5}
    assert build_config(gamma, {}, ENGINE).burstiness == 0.5
    assert build_config(gamma, {"arrival": "poisson"}, ENGINE).burstiness is None
    assert build_config(gamma, {"arrival": "gamma"}, ENGINE).burstiness == 0.5
    traced = {"arrival": "trace", "trace": "t.jsonl", "time_scale": 0.5}
    cfg = build_config(traced, {"arrival": "constant", **BASE}, ENGINE)
    assert (cfg.trace, cfg.time_scale) == (None, 1.0)
    assert build_config(traced, {}, ENGINE).to_dict()["input_len"] is None


# ---- what every request carries ---------------------------------------------------------------


def test_headers_extra_body_and_sampling_are_parsed_and_recorded_without_secrets() -> None:
    cfg = build(
        headers=["X-Priority=1", "Authorization: Bearer sk-secret", "x-api-key=abc"],
        extra_body='{"min_p": 0.1}',
        temperature=0.5,
        top_p=0.9,
    )
    assert cfg.headers == {
        "X-Priority": "1",
        "Authorization": "Bearer sk-secret",
        "x-api-key": "abc",
    }
    assert cfg.extra_body == {"min_p": 0.1}
    assert cfg.sampling() == {"temperature": 0.5, "top_p": 0.9}
    recorded = cfg.to_dict()
    assert recorded["headers"] == {"X-Priority": "1", "Authorization": "***", "x-api-key": "***"}
    assert "sk-secret" not in repr(recorded) and "abc" not in repr(recorded)
    assert build().sampling() == {"temperature": 0.0}  # greedy by default
    profile = {**BASE, "headers": {"X-A": "b"}, "extra_body": {"min_p": 1}}
    assert (build(profile).headers, build(profile).extra_body) == ({"X-A": "b"}, {"min_p": 1})


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        ({"headers": ["no-separator"]}, "expected 'NAME: VALUE'"),
        ({"headers": ["Authorization Basic abc="]}, "expected 'NAME: VALUE'"),
        ({"extra_body": "{min_p: 0.1}"}, "not JSON"),
        ({"extra_body": "[1]"}, "expected a JSON object"),
        ({"temperature": -1.0}, "temperature must be >= 0"),
        ({"top_p": 0.0}, "top_p must be in (0, 1]"),
        ({"top_k": -2}, "top_k must be >= 1"),
        ({"in_process": True, "headers": ["X-A=1"]}, "not with --in-process"),
    ],
)
def test_bad_request_fields_are_refused(flags: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        build(**flags)


def test_a_ramp_up_replaces_the_rate_and_keeps_a_concurrency_cap() -> None:
    flags = {
        "ramp_up_strategy": "linear",
        "ramp_up_start_rps": 1,
        "ramp_up_end_rps": 20,
        "concurrency": 4,
    }
    cfg = build_config(load_profile("default"), flags, ENGINE)
    assert cfg.rate is None and not cfg.closed_loop  # an open loop, capped at 4
    ramp = cfg.ramp()
    assert ramp is not None and (ramp.start, ramp.end, ramp.num_requests) == (1.0, 20.0, 50)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        ({"ramp_up_strategy": "linear", "rate": 2.0}, "--rate cannot go with it"),
        ({"ramp_up_strategy": "linear", "ramp_up_end_rps": 5.0}, "needs --ramp-up-start-rps"),
        ({"ramp_up_end_rps": 5.0}, "need --ramp-up-strategy"),
        (
            {
                "ramp_up_strategy": "linear",
                "ramp_up_start_rps": 1,
                "ramp_up_end_rps": 5,
                "num_requests": None,
                "duration": 10.0,
            },
            "and --num-requests",
        ),
    ],
)
def test_bad_ramp_ups_are_refused(flags: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        build_config({"num_requests": 10}, flags, ENGINE)


def test_a_profiles_data_file_may_be_named_relative_to_the_profile(tmp_path, monkeypatch) -> None:
    """profiles/speculative.toml names data/copy-edit.json beside it: found from any folder."""
    from pathlib import Path

    from loadgen.profiles import load_profile

    monkeypatch.chdir(tmp_path)
    bundles = load_profile("speculative")["sweep"]["workload"]
    dataset = next(b["dataset"] for b in bundles if "dataset" in b)
    kind, _, path = dataset.partition(":")
    assert kind == "sharegpt" and Path(path).is_absolute() and Path(path).is_file()


# ---- credentials: sent, never written or printed (issue 41 item 13) ---------------------------


@pytest.mark.parametrize(
    ("text", "parsed"),
    [
        ("Authorization: Basic YWJj=", ("Authorization", "Basic YWJj=")),  # '=' in the value
        ("Authorization:Bearer a=b=c", ("Authorization", "Bearer a=b=c")),
        ("X-Tenant=a", ("X-Tenant", "a")),
        ("X-Url=http://x:1/y", ("X-Url", "http://x:1/y")),  # 'X-Url=http' is no header name
        ("X-Team: infra=1", ("X-Team", "infra=1")),
    ],
)
def test_headers_split_as_http_writes_them(text: str, parsed: tuple[str, str]) -> None:
    assert build(headers=[text]).headers == dict([parsed])


def test_a_bad_header_flag_never_echoes_its_value() -> None:
    with pytest.raises(ValueError, match="expected 'NAME: VALUE'") as e:
        build(headers=["Authorization Basic sekrit="])
    assert "sekrit" not in str(e.value)


@pytest.mark.parametrize(
    "name",
    ["Authorization", "Proxy-Authorization", "Cookie", "X-Api-Key", "X-Auth-Token", "X-Password"],
)
def test_credential_headers_are_masked(name: str) -> None:
    recorded = build(headers=[f"{name}: sekrit", "X-Tenant: a"]).to_dict()
    assert recorded["headers"] == {name: "***", "X-Tenant": "a"}


def test_urls_lose_their_credentials_in_what_is_written() -> None:
    from loadgen.redact import redact_url

    url = "http://user:pa55@host:8000/v1?api_key=sk-1&api-version=2024&token=t0k"
    shown = redact_url(url)
    assert shown == "http://***@host:8000/v1?api_key=***&api-version=2024&token=***"
    recorded = build(base_url=url, model="m").to_dict()
    assert "pa55" not in repr(recorded) and "sk-1" not in repr(recorded)
    assert "t0k" not in repr(recorded) and recorded["base_url"] == shown


def test_the_api_path_goes_before_the_query() -> None:
    from loadgen.backends import OpenAIBackend

    backend = OpenAIBackend("http://u:p@h:1/v1/?api_key=k", "m")
    assert backend.url == "http://u:p@h:1/v1/completions?api_key=k"
    assert backend.shown_url == "http://***@h:1/v1/completions?api_key=***"


def test_a_sweeps_plan_masks_header_flags_and_urls_too() -> None:
    from loadgen.redact import redact_settings  # what the sweep writes its plan with

    plan = {
        "flags": {"headers": ["Authorization: Basic YWJj=", "X-Tenant=a"], "api_key": "sk"},
        "profile": {"base_url": "http://u:p@h/v1", "headers": {"X-Auth-Token": "t"}},
    }
    assert redact_settings(plan) == {
        "flags": {"headers": ["Authorization: ***", "X-Tenant: a"], "api_key": "***"},
        "profile": {"base_url": "http://***@h/v1", "headers": {"X-Auth-Token": "***"}},
    }


# ---- extra-body keys the load generator owns (issue 41 item 15) -------------------------------


@pytest.mark.parametrize(
    ("body", "flag"),
    [
        ('{"n": 4}', "--n"),
        ('{"max_tokens": 9}', "--output-len"),
        ('{"max_completion_tokens": 9}', "--output-len"),
        ('{"ignore_eos": false}', "--no-ignore-eos"),
        ('{"stream": false}', "streams every request"),
        ('{"stream_options": {"include_usage": false}}', "asks for usage"),
        ('{"model": "x"}', "--model"),
        ('{"prompt": "hi"}', "--input-len"),
        ('{"messages": []}', "--input-len"),
    ],
)
def test_extra_body_cannot_set_what_the_load_generator_measures(body: str, flag: str) -> None:
    with pytest.raises(ValueError, match=re.escape(flag)):
        build(extra_body=body)
    assert build(extra_body='{"min_p": 0.1, "priority": 1}').extra_body["min_p"] == 0.1


def test_extra_body_priority_is_refused_where_traffic_classes_set_priorities() -> None:
    classes = ["a:rate=2,priority=0", "b:rate=1,priority=1"]
    with pytest.raises(ValueError, match="priority each traffic class sends"):
        build(extra_body='{"priority": 5}', classes=classes)
    assert build(extra_body='{"priority": 5}', classes=["a:rate=2", "b:rate=1"]).classes
