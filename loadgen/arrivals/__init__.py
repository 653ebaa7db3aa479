"""Arrival processes: when each request is sent. One registered class a process (base.py
says what one is), the seeded schedule built from one (schedule.py), vLLM's ramp-up of a
rate (ramp.py) and the statistics of the arrival check (stats.py)."""

import importlib

from loadgen.arrivals.base import (
    ArrivalProcess,
    arrival_keys,
    arrival_names,
    arrival_process,
    owner,
    param,
    param_fields,
    param_type,
    processes,
    register,
    unregister,
)
from loadgen.arrivals.ramp import RAMPS, Ramp
from loadgen.arrivals.rated import RatedProcess
from loadgen.arrivals.schedule import Arrivals, take_schedule
from loadgen.arrivals.stats import gammainc, ks_pvalue, ks_statistic, ks_two_sample

# The processes, each registered as its module is imported; this order is the CLI's and the
# error messages' (poisson, the default, first).
BUILTIN = ("poisson", "gamma", "constant", "trace")
for _module in BUILTIN:
    importlib.import_module(f"loadgen.arrivals.{_module}")

__all__ = [
    "RAMPS",
    "ArrivalProcess",
    "Arrivals",
    "Ramp",
    "RatedProcess",
    "arrival_keys",
    "arrival_names",
    "arrival_process",
    "gammainc",
    "ks_pvalue",
    "ks_statistic",
    "ks_two_sample",
    "owner",
    "param",
    "param_fields",
    "param_type",
    "processes",
    "register",
    "take_schedule",
    "unregister",
]
