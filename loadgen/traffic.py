"""Traffic classes: one run mixing several kinds of request (interactive chat beside a batch
job, say), each with its own arrival process and rate, lengths, shared prefix, `n`, priority,
SLO and request count, so the server is judged class by class under the mix.

A class is a TOML `[[class]]` table (`name` plus the keys below) or the flag
`--class "NAME:key=value,..."`; it inherits every key of the run that it does not set."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

from loadgen.arrivals import arrival_names, arrival_process, owner, param_fields, param_type
from loadgen.metrics import SLO
from loadgen.workload import DEFAULT_INPUT_LEN, DEFAULT_OUTPUT_LEN, LengthDist

# The keys a class may set besides its process's (`class_keys`), and their types; all but n
# and priority default to the run's.
_KEYS: dict[str, type] = {
    "num_requests": int,
    "input_len": str,
    "output_len": str,
    "shared_prefix_len": int,
    "num_prefix_groups": int,
    "n": int,
    "priority": int,
    "slo": str,
}


def class_keys() -> dict[str, type]:
    """The keys a class may set: its process, rate and the parameters of every process a
    class may use (loadgen/arrivals), then the rest."""
    params = {name: param_type(name) for name in param_fields(in_classes=True)}
    return {"arrival": str, "rate": float} | params | _KEYS


_NAME = re.compile(r"[A-Za-z0-9_-]+")  # it goes into column names: class.NAME.ttft_s.p99


@dataclass(slots=True)
class TrafficClass:
    """One class, resolved: every key set (from the class, else the run)."""

    name: str
    arrival: str = "poisson"
    rate: float | None = None  # a rated process's
    arrival_params: dict[str, Any] = field(default_factory=dict)  # its parameters given
    num_requests: int | None = None  # this class's own count; None: until the run's duration
    input_len: str = DEFAULT_INPUT_LEN
    output_len: str = DEFAULT_OUTPUT_LEN
    shared_prefix_len: int = 0
    num_prefix_groups: int = 1
    n: int = 1
    priority: int | None = None
    slo: str | None = None

    def __getattr__(self, name: str) -> Any:
        """An arrival parameter by its flat name (cls.burstiness); None when not given."""
        if name not in param_fields(in_classes=True):
            raise AttributeError(name)
        return self.arrival_params.get(name)

    def validate(self, duration_s: float | None) -> None:
        def bad(key: str, why: str) -> ValueError:
            return ValueError(f"class {self.name!r}: {key} {why}")

        if self.arrival not in arrival_names(in_classes=True):
            known = ", ".join(arrival_names(in_classes=True))
            raise bad("arrival", f"{self.arrival!r}: expected one of {known}")
        process = arrival_process(self.arrival)
        if process.rated and self.rate is None:
            raise bad("rate", "is not set (in the class, or the run's --rate)")
        if process.rated and not self.rate > 0:  # type: ignore[operator]
            raise bad("rate", f"must be > 0 requests/s (or inf), got {self.rate}")
        if not process.rated and self.rate is not None:
            raise bad("rate", f"cannot go with {self.arrival} arrivals: they set their own pace")
        for key in self.arrival_params:
            theirs = owner(key)
            if key not in process.own_keys() and theirs is not None:
                raise bad(key, f"shapes {theirs.name} arrivals; {self.arrival} has none")
        try:
            process.build(self.rate, self.arrival_params)
        except ValueError as e:
            raise ValueError(f"class {self.name!r}: {e}") from None
        if self.num_requests is None and duration_s is None:
            raise bad("num_requests", "is not set, and the run has no --duration to end it")
        if self.num_requests is not None and self.num_requests < 1:
            raise bad("num_requests", f"must be >= 1, got {self.num_requests}")
        if self.rate == math.inf and self.num_requests is None:
            raise bad("rate", "inf sends everything at once: give the class num_requests")
        for key in ("input_len", "output_len"):
            try:
                LengthDist.parse(getattr(self, key))
            except ValueError as e:
                raise bad(key, str(e)) from None
        if self.shared_prefix_len < 0:
            raise bad("shared_prefix_len", f"must be >= 0, got {self.shared_prefix_len}")
        if self.num_prefix_groups < 1:
            raise bad("num_prefix_groups", f"must be >= 1, got {self.num_prefix_groups}")
        if self.n < 1:
            raise bad("n", f"must be >= 1 completions per prompt, got {self.n}")
        try:
            SLO.parse(self.slo)
        except ValueError as e:
            raise bad("slo", str(e)) from None

    def describe(self) -> str:
        """For titles: "interactive: poisson 2 req/s, priority 0"."""
        params = {k: getattr(self, k) for k in param_fields(in_classes=True)}
        settings = {"rate": self.rate} | params
        text = f"{self.name}: {arrival_process(self.arrival).describe(settings)}"
        text += f", n={self.n}" if self.n > 1 else ""
        return text + (f", priority {self.priority}" if self.priority is not None else "")


def parse_class_flag(text: str) -> dict[str, Any]:
    """`NAME:key=value,key=value` as a class table. An SLO keeps its own commas:
    `slo=ttft=0.5,tpot=0.05` (a ttft/tpot/e2e part right after `slo` belongs to it)."""
    name, sep, rest = text.partition(":")
    if not sep or not name.strip():
        raise ValueError(
            f"--class {text!r}: expected NAME:key=value,... "
            "(e.g. interactive:rate=2,input_len=128,priority=0)"
        )
    table: dict[str, Any] = {"name": name.strip()}
    last = None
    for part in filter(None, (p.strip() for p in rest.split(","))):
        key, eq, value = part.partition("=")
        key = key.strip()
        if not eq:
            raise ValueError(f"--class {text!r}: {part!r} is not key=value")
        if last == "slo" and key in ("ttft", "tpot", "e2e"):
            table["slo"] += f",{part}"
            continue
        if key in table:
            raise ValueError(f"class {table['name']!r}: {key} is given twice")
        table[key], last = value.strip(), key
    return table


def resolve_classes(tables: list[Any], run: dict[str, Any]) -> list[TrafficClass]:
    """Class tables (TOML or flag) completed from the run's keys (`run`: the resolved run
    config as a dict), checked; errors name the class and the key."""
    if not isinstance(tables, list):
        raise ValueError("profile key 'class' must be an array of tables: write [[class]]")
    out: list[TrafficClass] = []
    for k, table in enumerate(tables):
        if not isinstance(table, dict):
            raise ValueError(f"class {k + 1}: expected a table of settings, got {table!r}")
        name = str(table.get("name") or "").strip()
        if not _NAME.fullmatch(name):
            raise ValueError(
                f"class {k + 1}: name {name!r}: give each class a name of letters, digits, "
                "'_' or '-'"
            )
        if name in {c.name for c in out}:
            raise ValueError(f"class {name!r} is defined twice")
        given = {key: v for key, v in table.items() if key != "name" and v is not None}
        keys = class_keys()
        for key in given:
            if key not in keys:
                known = ", ".join(keys)
                raise ValueError(f"class {name!r}: {key!r} is not a class setting ({known})")
        values = {key: _typed(name, key, v) for key, v in given.items()}
        inherited = {key: run.get(key) for key in keys if key not in ("n", "priority")}
        arrival = values.get("arrival", inherited["arrival"])
        own = _own_keys(arrival)
        for key in [k for k in inherited if k not in own and (k == "rate" or owner(k))]:
            inherited[key] = None  # a gamma run's shape is moot for a Poisson class
        merged = {key: v for key, v in inherited.items() if v is not None} | values
        params = {k: merged.pop(k) for k in list(merged) if k in param_fields()}
        cls = TrafficClass(name, **merged, arrival_params=params)
        cls.validate(run.get("duration"))
        out.append(cls)
    return out


def _own_keys(arrival: Any) -> tuple[str, ...]:
    """The run keys of a class's process, `rate` among them when it is rated."""
    try:
        process = arrival_process(str(arrival))
    except ValueError:
        return ()  # validate() names the bad process
    return process.own_keys() + (("rate",) if process.rated else ())


def _typed(name: str, key: str, value: Any) -> Any:
    """A TOML value or a flag's text as the key's type."""
    kind = class_keys()[key]
    what = {str: "a text", int: "an integer", float: "a number"}[kind]
    try:
        if isinstance(value, bool) or (kind is str and not isinstance(value, str | int)):
            raise ValueError
        if kind is str:
            return str(value)
        number = float(value) if kind is float or isinstance(value, float) else int(value)
        if kind is int and not float(number).is_integer():
            raise ValueError
        return kind(number)
    except ValueError:
        raise ValueError(f"class {name!r}: {key} {value!r} is not {what}") from None
