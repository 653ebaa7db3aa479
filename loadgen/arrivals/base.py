"""What an arrival process is, and the registry that names them: one class a process, with its
parameters (dataclass fields declared with `param`), their checks, a seeded gap sampler and,
where it has one, the gap CDF for the run's Kolmogorov-Smirnov check. The run's config, traffic
classes, the CLI's flags, the gate's load keys and the report's words all read this registry,
so adding a process is one module (see DEVELOPING.md, "How to add an arrival process")."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

_SAME = object()


def param(default: Any, help: str, *, unset: Any = _SAME) -> Any:
    """A parameter the user sets (a flat run key, a `--flag`, a class key): `help` is its
    one-line doc; `unset` is what the run's config records when it is not given (default: the
    parameter's default; None where "not given" should read as such, as --burstiness)."""
    recorded = default if unset is _SAME else unset
    return field(default=default, metadata={"help": help, "unset": recorded})


@dataclass(frozen=True, slots=True)
class ArrivalProcess:
    """An open-loop arrival process. Subclasses set `name` and `description`, declare their
    parameters with `param`, check them in `check` (ValueError naming the key) and draw gaps
    in `gaps` from the generator they are given (the same seed: the same schedule)."""

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""  # one line: the CLI's --arrival help and the docs
    rated: ClassVar[bool] = False  # paced by --rate (the run's or a class's)
    in_classes: ClassVar[bool] = True  # may pace a traffic class
    run_keys: ClassVar[tuple[str, ...]] = ()  # run settings of its own besides its params
    replays: ClassVar[bool] = False  # replays recorded requests: their times and lengths

    def __post_init__(self) -> None:
        self.check()

    def check(self) -> None:
        """Refuse parameters the process cannot run with."""

    def gaps(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """n inter-arrival gaps in seconds, drawn from `rng`."""
        raise NotImplementedError

    def offsets(self, seed: int) -> Iterator[float]:
        """Absolute send offsets in seconds, the first at 0: gaps drawn in blocks of 1,024
        from one generator seeded once."""
        rng = np.random.default_rng(seed)
        t = 0.0
        while True:
            for gap in self.gaps(rng, 1024):
                yield t
                t += float(gap)

    def gap_cdf(self) -> Callable[[np.ndarray], np.ndarray] | None:
        """The CDF of the target gap (the run's one-sample KS check); None where there is none."""
        return None

    @property
    def mean_rate(self) -> float | None:
        """Requests per second the process aims at, for the arrival check (None: no target)."""
        return None

    @classmethod
    def describe(cls, settings: Mapping[str, Any], per_s: str = "req/s") -> str:
        """What ran, in words, from the run's (or a class's) settings: the report's subtitle."""
        given = [f"{p.name} {settings.get(p.name)}" for p in cls.params()]
        return " ".join([cls.name, *given])

    @classmethod
    def check_run(cls, run: Any) -> None:
        """Refuse run settings that cannot go with this process (`run`: a RunConfig)."""
        if run.rate is not None and not cls.rated:
            raise ValueError(f"{cls.name} arrivals set their own pace: --rate cannot go with them")

    @classmethod
    def params(cls) -> tuple[dataclasses.Field, ...]:
        """The parameters a user sets (fields declared with `param`)."""
        return tuple(f for f in dataclasses.fields(cls) if "help" in f.metadata)

    @classmethod
    def own_keys(cls) -> tuple[str, ...]:
        """Every run key of this process: its run keys, then its parameters."""
        return cls.run_keys + tuple(p.name for p in cls.params())

    @classmethod
    def refuse(cls, key: str, arrival: str) -> str:
        """Why `key` (one of ours) cannot go with another process."""
        return f"--{key.replace('_', '-')} shapes {cls.name} arrivals; {arrival} has none"

    @classmethod
    def check_params(cls, params: Mapping[str, Any]) -> None:
        """Refuse bad parameter values now, before any run (a ValueError naming the key)."""
        cls.build(None, params)

    @classmethod
    def build(cls, rate: float | None, params: Mapping[str, Any]) -> ArrivalProcess:
        """The process from a run's or class's settings (those of other processes ignored)."""
        own = {p.name: params[p.name] for p in cls.params() if params.get(p.name) is not None}
        if cls.rated and rate is not None:
            own["rate"] = rate
        return cls(**own)


_REGISTRY: dict[str, type[ArrivalProcess]] = {}


def register(cls: type[ArrivalProcess]) -> type[ArrivalProcess]:
    """Make a process known by its name (a class decorator; apply it above @dataclass)."""
    if not cls.name or cls.name in _REGISTRY:
        raise ValueError(f"arrival process {cls.name!r}: no name, or the name is taken")
    for p in cls.params():
        other = param_field(p.name)
        if other is not None and other.metadata != p.metadata:
            raise ValueError(f"arrival parameter {p.name!r} is declared differently twice")
    _REGISTRY[cls.name] = cls
    return cls


def unregister(name: str) -> None:
    """Forget a process (tests that register a toy one)."""
    _REGISTRY.pop(name, None)


def arrival_names(*, in_classes: bool = False) -> tuple[str, ...]:
    return tuple(n for n, c in _REGISTRY.items() if c.in_classes or not in_classes)


def arrival_process(name: str) -> type[ArrivalProcess]:
    """The process registered as `name`; a ValueError naming the known ones otherwise."""
    try:
        return _REGISTRY[name]
    except KeyError:
        known = ", ".join(_REGISTRY)
        raise ValueError(f"arrival {name!r}: expected one of {known}") from None


def processes() -> tuple[type[ArrivalProcess], ...]:
    return tuple(_REGISTRY.values())


def param_fields(*, in_classes: bool = False) -> dict[str, dataclasses.Field]:
    """Every registered process's parameters by name, in registration order."""
    out: dict[str, dataclasses.Field] = {}
    for cls in processes():
        if cls.in_classes or not in_classes:
            out |= {p.name: p for p in cls.params() if p.name not in out}
    return out


def param_field(name: str) -> dataclasses.Field | None:
    return param_fields().get(name)


def param_type(name: str) -> type:
    """A parameter's type, from its default (profiles may write 2 for 2.0)."""
    f = param_fields()[name]
    return type(f.default) if f.default is not None else str


def owner(key: str) -> type[ArrivalProcess] | None:
    """The process whose key this is (the first registered, where several share it)."""
    return next((c for c in processes() if key in c.own_keys()), None)


def arrival_keys() -> tuple[str, ...]:
    """Every run key of every process (run keys and parameters), in registration order: the
    gate compares them between runs."""
    out: dict[str, None] = {}
    for cls in processes():
        out |= dict.fromkeys(cls.own_keys())
    return tuple(out)
