"""A run's whole configuration (RunConfig), checked once and recorded with every result;
loadgen/profiles.py builds it from a profile and the flags given."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from loadgen.arrivals import Ramp, param_fields
from loadgen.arrivals.settings import (
    arrival_param,
    check_arrival,
    flat_params,
    is_rated,
    process_or_none,
)
from loadgen.metrics import SLO
from loadgen.redact import redact_settings
from loadgen.traffic import TrafficClass
from loadgen.workload import LengthDist


@dataclass(slots=True)
class RunConfig:
    name: str = "run"
    # target: an external server (base_url) or the bundled engine (model + engine settings)
    base_url: str | None = None
    model: str | None = None  # bundled: smollm2-135m; external: the server's first model
    endpoint: str = "completions"  # completions | chat
    tokenizer: str | None = None
    api_key: str | None = None
    in_process: bool = False  # bundled engine without HTTP
    # serve in this process with transformers generate, static batches of this size (1: one
    # request at a time): the naive baseline `bench claims` compares the engine with
    naive_batch: int | None = None
    engine: dict[str, Any] = field(default_factory=dict)
    # bundled: the real engine. sim: its scheduler and KV cache on a virtual clock, steps timed
    # by a cost model (engine/sim) on a device (a100, h100, h200, b200, local = this machine)
    engine_kind: str = "bundled"
    sim_device: str | None = None  # None: local
    sim_cost_model: str | None = None  # None: calibrated where a profile is found, else roofline
    sim_profile: str | None = None  # a `bench calibrate` profile; None: the default path
    # speculative decoding's acceptance: a rate per draft token (0.7) or rates per draft
    # position ("0.8,0.6,0.45", as vLLM reports them); engine/sim/speculation.py
    sim_acceptance: float | str | list[float] | None = None
    # Of decodes that get a draft (n-gram misses the rest), or per-request shares; None: 1
    sim_draft_share: float | str | list[float] | None = None
    # arrivals: a registered process (loadgen/arrivals) and the parameters of its own that
    # were given (--burstiness, --time-scale, ...; read back as cfg.burstiness); a rated one
    # is paced by --rate, or alone with --concurrency it is a closed loop
    arrival: str = "poisson"
    rate: float | None = None
    arrival_params: dict[str, Any] = field(default_factory=dict)
    concurrency: int | None = None
    trace: str | None = None  # the trace process's file (it gives the lengths too)
    trace_format: str = "jsonl"
    trace_model: str | None = None
    ramp_up_strategy: str | None = None  # linear | exponential: the rate moves over the run
    ramp_up_start_rps: float | None = None
    ramp_up_end_rps: float | None = None
    num_requests: int | None = None
    duration: float | None = None
    warmup: int = 0
    seed: int = 0
    # processes sending the load (loadgen/split_runner.py); 1: this one; "auto": picked at
    # start (loadgen/worker_count.py), then the N picked
    workers: int | str = 1
    ray_address: str | None = None  # the workers as Ray actors (loadgen/ray_runner.py)
    # workload
    input_len: str | None = None  # None: 256; a trace or dataset gives its own
    input_len_after_template: bool = False  # chat: --input-len counts the templated prompt
    output_len: str | None = None  # None: 128; a trace or dataset gives its own
    dataset: str | None = None
    shared_prefix_len: int = 0
    num_prefix_groups: int = 1
    ignore_eos: bool = True
    n: int = 1  # completions per prompt (parallel sampling; the OpenAI field)
    turns: str | None = None  # multi-turn: turns per conversation (a length spec: 4, uniform:2:6)
    think_time: float = 0.0  # multi-turn: seconds between a reply and the next turn
    # traffic classes: several request kinds in one run, each with its own arrivals and
    # lengths, measured apart; the run's own keys are what a class does not set
    classes: list[TrafficClass] = field(default_factory=list)
    # what every request carries besides its prompt (vLLM's bench flags)
    temperature: float = 0.0
    top_p: float | None = None  # None: not sent (the server's default)
    top_k: int | None = None
    headers: dict[str, str] = field(default_factory=dict)
    extra_body: dict[str, Any] = field(default_factory=dict)  # merged last into each body
    # judging and output
    slo: str | None = None
    max_p99_lag_ms: float = 10.0
    timeout: float = 600.0
    telemetry_interval: float = 0.1  # seconds between telemetry samples
    out: str | None = None
    save_vllm_json: str | None = None  # also write the result as `vllm bench serve` would
    overwrite_vllm_json: bool = False  # else an existing file there is refused

    def __getattr__(self, name: str) -> Any:
        """An arrival parameter by its flat name (cfg.burstiness): the value given, else what
        the process records when it is not given."""
        if name not in param_fields():  # before self.arrival_params: unpickling asks too
            raise AttributeError(name)
        return arrival_param(self.arrival_params, name)

    @property
    def replays(self) -> bool:
        """The process replays recorded requests, their times and lengths (a trace)."""
        process = process_or_none(self.arrival)
        return process.replays if process else False

    @property
    def closed_loop(self) -> bool:
        return (
            not self.classes
            and is_rated(self.arrival)
            and self.rate is None
            and self.ramp_up_strategy is None
            and self.concurrency is not None
        )

    def ramp(self) -> Ramp | None:
        if self.ramp_up_strategy is None:
            return None
        start, end = self.ramp_up_start_rps, self.ramp_up_end_rps
        if start is None or end is None or self.num_requests is None:
            raise ValueError(
                "--ramp-up-strategy needs --ramp-up-start-rps, --ramp-up-end-rps and "
                "--num-requests (the rate moves with the request's index, as in vLLM)"
            )
        return Ramp(self.ramp_up_strategy, start, end, self.num_requests)

    def validate(self) -> None:
        if self.endpoint not in ("completions", "chat"):
            raise ValueError(f"endpoint {self.endpoint!r}: expected completions or chat")
        if self.classes:
            self._validate_classes()
        check_arrival(self)
        if self.replays and self.dataset:
            raise ValueError("a trace gives the lengths: --dataset cannot go with --arrival trace")
        if self.dataset and self.input_len is not None:
            raise ValueError("a dataset gives the prompts: --input-len cannot go with --dataset")
        if self.input_len_after_template and (
            self.endpoint != "chat" or self.replays or self.dataset or self.turns
        ):
            raise ValueError(
                "--input-len-after-template takes a chat template's tokens off synthetic "
                "single-turn prompts: it needs --endpoint chat, and no trace, dataset or --turns"
            )
        if not 1 <= self.n <= 256:
            raise ValueError(f"n must be in [1, 256] completions per prompt, got {self.n}")
        if self.n > 1 and self.turns is not None:
            raise ValueError("--n with --turns: a conversation follows one reply, not n")
        if self.n > 1 and self.replays:
            raise ValueError("--n with a trace: the trace's rows are single requests")
        if self.turns is not None:
            LengthDist.parse(self.turns)
            if self.replays:
                raise ValueError("a trace replays single requests: --turns cannot go with it")
        if not (self.think_time >= 0 and math.isfinite(self.think_time)):
            raise ValueError(f"think time must be >= 0 seconds, got {self.think_time}")
        if self.think_time and self.turns is None:
            raise ValueError("--think-time is the pause between turns: it needs --turns")
        if (
            self.num_requests is None
            and self.duration is None
            and not self.replays
            and not self.classes
        ):
            raise ValueError("give --num-requests N and/or --duration S")
        for key in ("num_requests", "warmup", "concurrency"):
            value = getattr(self, key)
            if value is not None and value < (0 if key == "warmup" else 1):
                raise ValueError(f"{key} must be >= {0 if key == 'warmup' else 1}, got {value}")
        if not 0.01 <= self.telemetry_interval <= 60:
            raise ValueError(f"telemetry interval {self.telemetry_interval} s: use 0.01..60")
        if self.duration is not None and not self.duration > 0:
            raise ValueError(f"duration must be > 0 seconds, got {self.duration}")
        if self.in_process and self.base_url:
            raise ValueError("--in-process runs the bundled engine; it cannot go with --base-url")
        if self.base_url and self.engine:
            names = ", ".join(f"--{k.replace('_', '-')}" for k in self.engine if k != "seed")
            if names:
                raise ValueError(f"{names}: engine settings apply to the bundled engine only")
        if self.rate is not None and not self.rate > 0:
            raise ValueError(f"rate must be > 0 requests/s (or inf), got {self.rate}")
        if self.rate == math.inf and self.num_requests is None and is_rated(self.arrival):
            raise ValueError("--rate inf sends everything at once: give --num-requests")
        SLO.parse(self.slo)  # a typo must fail now, not after the whole run
        if not (self.temperature >= 0 and math.isfinite(self.temperature)):
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_p is not None and not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k is not None and self.top_k < 1 and self.top_k != -1:
            raise ValueError(f"top_k must be >= 1 (or -1: off), got {self.top_k}")
        if self.naive_batch is not None:
            self._validate_naive()
        if self.workers != 1 or self.ray_address:
            from loadgen.split_runner import check_split

            check_split(self)
        self._validate_sim()
        _check_extra_body(self.extra_body)
        if "priority" in self.extra_body and any(c.priority is not None for c in self.classes):
            raise ValueError(
                "--extra-body 'priority' would replace the priority each traffic class sends "
                "(priority= in --class or the mix) while its results stay labelled with the "
                "class's own: give it there"
            )
        if self.in_process and (self.headers or self.extra_body):
            raise ValueError("--header and --extra-body go over HTTP: not with --in-process")
        for key in ("input_len", "output_len"):
            value = getattr(self, key)
            if value is not None:
                LengthDist.parse(value)

    def _validate_classes(self) -> None:
        """What a mix of classes cannot do: each class is an open-loop process of its own,
        merged by time with the others; a trace, a dataset, conversations or a ramp give one
        schedule for the whole run."""
        if self.rate is None and self.concurrency is not None:
            raise ValueError(
                "traffic classes are open-loop (each its own rate): a closed loop cannot mix "
                "them; give the classes rates (--concurrency with a rate caps them all)"
            )
        for key, flag in (
            ("trace", "--trace"),
            ("dataset", "--dataset"),
            ("turns", "--turns"),
            ("ramp_up_strategy", "--ramp-up-strategy"),
        ):
            if getattr(self, key) is not None:
                raise ValueError(f"{flag} cannot go with traffic classes (--class / [[class]])")
        if self.n > 1:
            raise ValueError("--n cannot go with traffic classes: give each class its own n")

    def _validate_sim(self) -> None:
        sim_keys = {"--sim-device": self.sim_device, "--sim-cost-model": self.sim_cost_model}
        sim_keys["--sim-profile"] = self.sim_profile
        sim_keys["--sim-acceptance"] = self.sim_acceptance
        sim_keys["--sim-draft-share"] = self.sim_draft_share
        if self.engine_kind not in ("bundled", "sim"):
            raise ValueError(f"--engine {self.engine_kind!r}: expected bundled or sim")
        if self.engine_kind == "bundled":
            given = [k for k, v in sim_keys.items() if v is not None]
            if given:
                raise ValueError(f"{', '.join(given)}: simulation settings need --engine sim")
            return
        for given, flag in (
            (self.base_url, "--base-url"),
            (self.naive_batch is not None, "--naive-batch"),
        ):
            if given:
                raise ValueError(f"--engine sim simulates the bundled engine: not with {flag}")
        if self.sim_cost_model not in (None, "calibrated", "roofline"):
            raise ValueError(
                f"--sim-cost-model {self.sim_cost_model!r}: expected calibrated or roofline"
            )
        from engine.sim.speculation import Acceptance, DraftShare

        if self.sim_acceptance is not None:
            Acceptance.parse(self.sim_acceptance)
        DraftShare.parse(self.sim_draft_share)

    def _validate_naive(self) -> None:
        """The naive baseline serves the bundled model itself, one completion a prompt; of
        the engine settings it honours dtype, device, seed and max_model_len, refuses those
        that change the model's arithmetic and ignores the scheduler's and cache's (config.json
        lists them), so a sweep can put it beside engine points of the same profile."""
        from loadgen.naive_backend import check_engine_settings

        assert self.naive_batch is not None
        if isinstance(self.naive_batch, bool) or not isinstance(self.naive_batch, int):
            raise ValueError(f"naive batch must be a whole number, got {self.naive_batch!r}")
        if self.naive_batch < 1:
            raise ValueError(f"naive batch must be >= 1 request, got {self.naive_batch}")
        for given, flag in ((self.base_url, "--base-url"), (self.in_process, "--in-process")):
            if given:
                raise ValueError(
                    f"--naive-batch serves the model in this process with transformers: "
                    f"it cannot go with {flag}"
                )
        if self.n > 1 or any(c.n > 1 for c in self.classes):
            raise ValueError("--naive-batch generates one completion a prompt: not with --n > 1")
        if self.headers or self.extra_body:
            raise ValueError("--header and --extra-body go over HTTP: not with --naive-batch")
        check_engine_settings(self.engine)

    def sampling(self) -> dict[str, Any]:
        """The sampling fields of each request body, as the OpenAI API (and vLLM) names them."""
        out: dict[str, Any] = {"temperature": self.temperature}
        given = (("top_p", self.top_p), ("top_k", self.top_k))
        return out | {k: v for k, v in given if v is not None}

    def flat(self) -> dict[str, Any]:
        """The settings as flat keys, every arrival parameter among them (given or unset), as
        profiles and flags name them and results files record them."""
        out = flat_params(dataclasses.asdict(self), in_classes=False)
        out["classes"] = [flat_params(dataclasses.asdict(c)) for c in self.classes]
        return out

    def to_dict(self) -> dict[str, Any]:
        """For results files: credentials masked (loadgen/redact.py); engine_kind only when the
        engine is ours (an external server's kind is config.json's `server`)."""
        out = redact_settings(self.flat())
        if self.base_url:
            out["engine_kind"] = None
        return out  # type: ignore[return-value]


# Body fields the load generator sets and reads back itself: one given in --extra-body would
# replace what it sends while its records and figures assume its own (n=4 in the body, n=1
# in the records: TPOT a quarter of the server's). Each is refused, naming what sets it.
OWNED_BODY_KEYS = {
    "n": "--n (records count every completion, ITL is taken per completion)",
    "max_tokens": "--output-len (each request's own length)",
    "max_completion_tokens": "--output-len (each request's own length)",
    "ignore_eos": "--ignore-eos / --no-ignore-eos",
    "stream": "nothing: the load generator streams every request to time its chunks",
    "stream_options": "nothing: the load generator asks for usage to count tokens",
    "model": "--model",
    "prompt": "--input-len, --dataset or --trace",
    "messages": "--input-len, --dataset or --trace (with --endpoint chat)",
}


def _check_extra_body(body: dict[str, Any]) -> None:
    owned = [key for key in body if key in OWNED_BODY_KEYS]
    if owned:
        uses = "; ".join(f"{key!r}: use {OWNED_BODY_KEYS[key]}" for key in owned)
        raise ValueError(
            f"--extra-body sets what the load generator sets and measures itself ({uses})"
        )
