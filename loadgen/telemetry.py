"""What the hardware and the server did during a run, sampled on a background thread onto the
same clock as the request records (perf_counter): GPUs through NVML; without a GPU, the
server process's CPU% and RSS; the whole machine's CPU busy and stolen by a hypervisor
(machine_cpu.py); and the engine's queue and KV-cache gauges from /metrics
(ours, vLLM's, SGLang's or llama.cpp's names, onto the same columns). Nothing here may crash
or slow a run: failures mean fewer columns, and a note says why."""

from __future__ import annotations

import contextlib
import re
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from loadgen.endpoints import http_get
from loadgen.machine_cpu import MachineCpu
from loadgen.redact import redact_url

# Prometheus names of the engine gauges we follow: ours, vLLM's, SGLang's, llama.cpp's (from
# their sources). kv_usage is a 0-1 fraction in all three; llama.cpp has no preemptions (a
# full slot defers the request) and newer builds no KV usage; SGLang calls them retractions.
ENGINE_GAUGES = {
    "running": (
        "servebench:num_requests_running",
        "vllm:num_requests_running",
        "sglang:num_running_reqs",
        "llamacpp:requests_processing",
    ),
    "waiting": (
        "servebench:num_requests_waiting",
        "vllm:num_requests_waiting",
        "sglang:num_queue_reqs",
        "llamacpp:requests_deferred",
    ),
    "kv_blocks_used": ("servebench:kv_blocks_used",),
    "kv_peak_blocks_used": ("servebench:kv_peak_blocks_used",),
    "kv_usage": (
        "vllm:gpu_cache_usage_perc",
        "vllm:kv_cache_usage_perc",
        "sglang:token_usage",
        "llamacpp:kv_cache_usage_ratio",
    ),
    "preemptions": (
        "servebench:num_preemptions_total",
        "vllm:num_preemptions_total",
        "sglang:num_retracted_requests_total",
    ),
    "prefix_cache_queries": (
        "servebench:prefix_cache_queries_total",
        "vllm:prefix_cache_queries_total",
    ),
    "prefix_cache_hits": ("servebench:prefix_cache_hits_total", "vllm:prefix_cache_hits_total"),
    # Speculative decoding's counters (vLLM's names; ours mirror them)
    "spec_drafts": (
        "servebench:spec_decode_num_drafts_total",
        "vllm:spec_decode_num_drafts_total",
    ),
    "spec_draft_tokens": (
        "servebench:spec_decode_num_draft_tokens_total",
        "vllm:spec_decode_num_draft_tokens_total",
    ),
    "spec_accepted_tokens": (
        "servebench:spec_decode_num_accepted_tokens_total",
        "vllm:spec_decode_num_accepted_tokens_total",
    ),
    "spec_lookups": ("servebench:spec_decode_num_lookups_total",),
    "spec_proposals": ("servebench:spec_decode_num_proposals_total",),
    "rss_bytes": ("process_resident_memory_bytes",),  # any Prometheus client exports it
}

# Accepted drafts by draft position (labelled position="i"): spec_accepted_pos<i>
PER_POSITION = (
    "servebench:spec_decode_num_accepted_tokens_per_pos_total",
    "vllm:spec_decode_num_accepted_tokens_per_pos_total",
)

# Engine gauges whose mean over the run matters, not only the peak: the batch the engine
# actually kept (an fp8 KV cache should hold about twice as many at the same budget).
TIME_AVERAGED = ("engine_running", "engine_kv_blocks_used")


METRIC_DIALECTS = ("servebench", "vllm", "sglang", "llamacpp")  # the names' prefixes


def metrics_dialect(text: str) -> str | None:
    """Whose names a /metrics page carries (the first known prefix on a sample line)."""
    for line in text.splitlines():
        prefix = line.partition(":")[0]
        if line and line[0] != "#" and prefix in METRIC_DIALECTS:
            return prefix
    return None


def parse_gauges(text: str) -> dict[str, float]:
    """The gauges above from Prometheus text (summed over label sets, e.g. vLLM's per model)."""
    wanted = {name: key for key, names in ENGINE_GAUGES.items() for name in names}
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        key = wanted.get(name)
        if name in PER_POSITION and (pos := re.search(r'position="(\d+)"', line)):
            key = f"spec_accepted_pos{pos[1]}"
        if key is not None:
            try:
                out[key] = out.get(key, 0.0) + float(line.rsplit(" ", 1)[1])
            except (IndexError, ValueError):
                continue
    return out


SPEC_COUNTS = ("drafts", "draft_tokens", "accepted_tokens", "lookups", "proposals")


def spec_summary(grew: dict[str, float], per_pos: Sequence[float] = ()) -> dict[str, Any]:
    """A run's speculative decoding from its counters' growth (`grew`: SPEC_COUNTS' keys;
    nothing if it drafted nothing): acceptance rate = accepted / draft tokens, mean
    acceptance length = tokens per verified draft, 1 + accepted / drafts (vLLM's
    definitions), the share of drafts whose position i was accepted and the share of
    decodes the proposer found a draft for (ours; what --sim-acceptance and
    --sim-draft-share take)."""
    drafts, tokens, accepted = grew["drafts"], grew["draft_tokens"], grew["accepted_tokens"]
    if not drafts:
        return {}
    out = {
        "spec_drafts": drafts,
        "spec_draft_tokens": tokens,
        "spec_accepted_tokens": accepted,
        "spec_acceptance_rate": accepted / tokens if tokens else None,
        "spec_mean_acceptance_length": 1 + accepted / drafts,
    }
    if per_pos:
        out["spec_acceptance_per_pos"] = [n / drafts for n in per_pos]
    if grew.get("lookups"):
        out["spec_draft_share"] = grew["proposals"] / grew["lookups"]
    return out


def spec_counts(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """The same from an in-process engine's `stats()` before and after a run."""
    key = "spec_decode_num_accepted_tokens_per_pos"
    per_pos = [a - b for a, b in zip(after[key], before[key], strict=True)]
    grew = {k: after[f"spec_decode_num_{k}"] - before[f"spec_decode_num_{k}"] for k in SPEC_COUNTS}
    return spec_summary(grew, per_pos)


class Telemetry:
    def __init__(
        self,
        pid: int | None = None,
        metrics_url: str | None = None,
        interval_s: float = 0.1,
        scrape_every: int = 5,
    ) -> None:
        self.pid, self.metrics_url, self.interval_s = pid, metrics_url, interval_s
        self.scrape_every = scrape_every  # /metrics every 5th sample: 0.5 s by default
        self.rows: list[dict[str, float]] = []
        self.notes: list[str] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._nvml: Any = None
        self._gpus: list[Any] = []
        self._proc: Any = None
        self._machine: MachineCpu | None = None
        self._scraped = False  # /metrics answered at least once
        self.dialect: str | None = None  # whose metric names it carried
        self._scrape_error: str | None = None  # the last failure, for the note

    def start(self) -> None:
        self._open_nvml()
        try:
            self._machine = MachineCpu()
        except Exception as e:  # psutil cannot read the machine's counters here
            self.notes.append(f"no machine CPU telemetry: {e}")
        if not self._gpus and self.pid is None:  # a server we did not start: no pid to watch
            self.notes.append(
                "no CPU telemetry: the server is not a process of this run's (memory only from"
                " its /metrics, when it exports process_resident_memory_bytes)"
            )
        if not self._gpus and self.pid is not None:
            try:
                import psutil

                self._proc = psutil.Process(self.pid)
                self._proc.cpu_percent()  # the first call only starts the count
            except Exception as e:  # no such process, no permission
                self.notes.append(f"no process telemetry: {e}")
        self._thread = threading.Thread(target=self._loop, name="telemetry", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self.metrics_url:  # one last scrape: the counters' final values
            row = {"t": time.perf_counter()}
            self._scrape(row)
            self.rows.append(row)
            where = redact_url(self.metrics_url)
            if not self._scraped:
                why = f" ({self._scrape_error})" if self._scrape_error else ""
                self.notes.append(
                    f"no engine gauges: nothing read from {where}{why} (llama-server exports it "
                    "with --metrics, SGLang with --enable-metrics)"
                )
            elif self.dialect is None:
                known = ", ".join(f"{d}:" for d in METRIC_DIALECTS)
                self.notes.append(f"no engine gauges: {where} carries none of {known} names")
        if self._nvml is not None:
            with contextlib.suppress(Exception):
                self._nvml.nvmlShutdown()

    @property
    def machine_cpus(self) -> int | None:
        """The CPUs machine_*_percent is out of (100 each), None before start or without."""
        return self._machine.cpus if self._machine is not None else None

    def _open_nvml(self) -> None:
        try:
            import pynvml

            pynvml.nvmlInit()
            self._gpus = [
                pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())
            ]
            self._nvml = pynvml
        except Exception as e:  # no driver or no GPU: NVMLError_LibraryNotFound and kin
            self.notes.append(f"no GPU telemetry ({type(e).__name__})")

    def _loop(self) -> None:
        k = 0
        next_t = time.perf_counter()
        while not self._stop.is_set():
            row: dict[str, float] = {"t": time.perf_counter()}
            self._sample_gpus(row)
            self._sample_process(row)
            if self._machine is not None:
                self._machine.sample(row)
            if self.metrics_url and k % self.scrape_every == 0:
                self._scrape(row)
            self.rows.append(row)
            k += 1
            next_t += self.interval_s
            self._stop.wait(max(0.0, next_t - time.perf_counter()))

    def _sample_gpus(self, row: dict[str, float]) -> None:
        nv = self._nvml
        for i, h in enumerate(self._gpus):
            try:
                mem = nv.nvmlDeviceGetMemoryInfo(h)
                row[f"gpu{i}_util_percent"] = float(nv.nvmlDeviceGetUtilizationRates(h).gpu)
                row[f"gpu{i}_memory_used_mb"] = mem.used / 2**20
                row[f"gpu{i}_memory_total_mb"] = mem.total / 2**20
                row[f"gpu{i}_power_w"] = nv.nvmlDeviceGetPowerUsage(h) / 1000.0
                row[f"gpu{i}_sm_clock_mhz"] = float(nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM))
            except Exception:
                continue

    def _sample_process(self, row: dict[str, float]) -> None:
        if self._proc is None:
            return
        try:
            with self._proc.oneshot():
                row["server_cpu_percent"] = self._proc.cpu_percent()
                row["server_rss_mb"] = self._proc.memory_info().rss / 2**20
        except Exception:
            self._proc = None  # the process is gone

    def _scrape(self, row: dict[str, float]) -> None:
        try:
            with http_get(self.metrics_url, None, timeout_s=1) as r:
                text = r.read().decode()
            gauges = parse_gauges(text)
            self.dialect = self.dialect or metrics_dialect(text)
            rss = gauges.pop("rss_bytes", None)
            if rss is not None and self._proc is None:  # a server we cannot see: its own word
                row["server_rss_mb"] = rss / 2**20
            row |= {f"engine_{k}": v for k, v in gauges.items()}
            self._scraped = True
        except Exception as e:
            self._scrape_error = f"{type(e).__name__}: {e}"[:200]

    def summary(self) -> dict[str, Any]:
        """Peaks and means for the run's summary (and each sweep point's row); `columns`
        says what was actually sampled (timeline.csv's columns)."""
        names = {k for r in self.rows for k in r} - {"t"}
        out: dict[str, Any] = {
            "samples": len(self.rows),
            "notes": self.notes,
            "columns": sorted(names),
        }
        if self.metrics_url:  # whose /metrics names were read (None: none we know)
            out["metrics_dialect"] = self.dialect
        if self._machine is not None:  # what 100 % of one core is a share of
            out["machine_cpus"] = self._machine.cpus

        def col(name: str) -> list[float]:
            return [r[name] for r in self.rows if name in r]

        for name in sorted(names):
            values = col(name)
            if name.endswith(("_percent", "_power_w")) or name in TIME_AVERAGED:
                out[f"mean_{name}"] = sum(values) / len(values)
            if not name.endswith("_total_mb"):
                out[f"peak_{name}"] = max(values)
        if "engine_preemptions" in names:
            p = col("engine_preemptions")
            out["preemptions"] = p[-1] - p[0]
        if {"engine_prefix_cache_queries", "engine_prefix_cache_hits"} <= names:
            q, h = col("engine_prefix_cache_queries"), col("engine_prefix_cache_hits")
            asked = q[-1] - q[0]  # over the run (the counters are the server's lifetime's)
            out["prefix_cache_hit_rate"] = (h[-1] - h[0]) / asked if asked else None
        spec = {k: f"engine_spec_{k}" for k in SPEC_COUNTS if f"engine_spec_{k}" in names}
        if {"drafts", "draft_tokens", "accepted_tokens"} <= set(spec):
            grew = {k: col(c)[-1] - col(c)[0] for k, c in spec.items()}  # over the run
            positions = sorted(
                (int(n.removeprefix("engine_spec_accepted_pos")), n)
                for n in names
                if n.startswith("engine_spec_accepted_pos")
            )
            per_pos = [col(n)[-1] - col(n)[0] for _, n in positions]
            out |= spec_summary(grew, per_pos)
        return out

    def write_csv(self, path: Path, t0: float) -> None:
        """timeline.csv: one row a sample, `t_s` on the request records' clock."""
        import pandas as pd

        frame = pd.DataFrame(self.rows)
        if len(frame):
            frame.insert(0, "t_s", frame.pop("t") - t0)
        frame.to_csv(path, index=False)
