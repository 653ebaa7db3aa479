"""How long a step takes, from its shape (engine/model/cost.py's StepShape): two models
behind one interface. `roofline` derives it from the model's shape and a device's peaks;
`calibrated` is fitted to the steps a real engine logged on this machine."""

from __future__ import annotations

import itertools
import json
import math
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from engine.config import ModelConfig
from engine.model.cost import StepShape, matmul_params
from engine.sim.hardware import DeviceSpec

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "fp8": 1}


class StepTimeModel(Protocol):
    name: str

    def step_time(self, shape: StepShape) -> float:
        """Seconds from the start of this step to the start of the next (busy engine)."""
        ...

    def describe(self) -> dict[str, Any]:
        """For config.json: which model, with what figures."""
        ...


# ---- roofline ------------------------------------------------------------------------------


@dataclass(slots=True)
class Efficiency:
    """Fractions of the device's peaks a kernel reaches, per regime, and what a step costs
    besides its kernels. Defaults are typical of vLLM on Hopper (assumptions, not measured
    here; a calibration sets them for a device it can run on)."""

    compute: float = 0.7  # large GEMMs (prefill, big batches)
    memory: float = 0.8  # streaming weights and KV (decode)
    attention: float = 0.5  # prefill attention FLOPs (flash attention)
    interconnect: float = 0.8  # ring all-reduce bus bandwidth
    overhead_s: float = 1.0e-3  # scheduling, input preparation, launches, sampling
    # more for a step with prefill (an engine may replay graphs of decode steps only)
    prefill_overhead_s: float = 0.0


@dataclass(slots=True)
class Roofline:
    """Each part of a step takes max(its FLOPs / peak, its bytes / bandwidth), and the parts
    run one after another: linears, LM head, attention (decodes read their KV: bandwidth;
    prefill chunks are compute), the KV writes, and with tensor parallelism two ring
    all-reduces of the hidden state per layer. With TP every weight, head and KV head is
    split over the ranks (KV heads replicated when there are fewer than ranks)."""

    model: ModelConfig
    device: DeviceSpec
    dtype: str = "bfloat16"  # activations and unquantized weights
    weight_dtype: str = "bfloat16"  # fp8 with --quantization fp8
    kv_dtype: str = "bfloat16"
    tp: int = 1
    eff: Efficiency = field(default_factory=Efficiency)
    efficiency_source: str = "assumed (typical of vLLM on Hopper)"
    name: str = "roofline"

    def step_time(self, shape: StepShape) -> float:
        return float(roofline_time(self.parts(shape), self.eff))

    def parts(self, shape: StepShape) -> tuple[float, ...]:
        """The step's parts at the device's peaks (efficiency 1), in PARTS' order."""
        m, d, tp = self.model, self.device, self.tp
        w_bytes, a_bytes = DTYPE_BYTES[self.weight_dtype], DTYPE_BYTES[self.dtype]
        # fp8 weights multiply as fp8 where tensor cores take it (activations quantized).
        mm_peak, peak = d.flops(self.weight_dtype), d.flops(self.dtype)
        params = matmul_params(m) / tp
        tokens = shape.tokens
        head = m.hidden_size * m.vocab_size / tp if shape.sampled_rows else 0.0
        kv_heads = math.ceil(m.num_kv_heads / tp)
        kv_token = 2 * m.num_layers * kv_heads * m.head_dim * DTYPE_BYTES[self.kv_dtype]
        attn_flops = 4.0 * m.num_layers * (m.num_heads / tp) * m.head_dim
        link_lat = link_bytes = 0.0
        if tp > 1:
            link_lat = 2 * m.num_layers * d.interconnect_latency_s
            volume = 2.0 * (tp - 1) / tp * tokens * m.hidden_size * a_bytes
            link_bytes = 2 * m.num_layers * volume / d.interconnect_bw
        return (
            2.0 * params * tokens / mm_peak,  # linears: compute
            params * w_bytes / d.memory_bw,  # linears: weights streamed
            2.0 * head * shape.sampled_rows / peak,  # LM head
            head * a_bytes / d.memory_bw,
            attn_flops * shape.decode_context_tokens / peak,  # decodes read their KV
            kv_token * shape.decode_context_tokens / d.memory_bw,
            attn_flops * shape.prefill_attention_pairs / peak,  # prefill attention
            kv_token * tokens / d.memory_bw,  # the new tokens' K and V
            link_lat,  # two ring all-reduces a layer
            link_bytes,
            1.0 if shape.prefill_tokens else 0.0,  # a step with prefill
        )

    def describe(self) -> dict[str, Any]:
        return {
            "cost_model": self.name,
            "device": self.device.to_dict(),
            "dtype": self.dtype,
            "weight_dtype": self.weight_dtype,
            "kv_dtype": self.kv_dtype,
            "tensor_parallel_size": self.tp,
            "efficiency": asdict(self.eff),
            "efficiency_source": self.efficiency_source,
        }


PARTS = ("linear_flops", "linear_bytes", "head_flops", "head_bytes", "decode_attention_flops",
         "decode_attention_bytes", "prefill_attention_flops", "kv_write_bytes", "link_latency",
         "link_bytes", "has_prefill")  # fmt: skip


def roofline_time(parts: Any, e: Efficiency) -> Any:
    """A step's time from its parts at peak (floats, or arrays of many steps' parts): each
    part at its regime's efficiency, compute and memory of one kernel overlapping (max), the
    kernels one after another, plus the per-step overhead."""
    lin_f, lin_b, head_f, head_b, dec_f, dec_b, pre_f, kv_b, link_lat, link_b, prefill = parts
    return (
        np.maximum(lin_f / e.compute, lin_b / e.memory)
        + np.maximum(head_f / e.compute, head_b / e.memory)
        + np.maximum(dec_f / e.compute, dec_b / e.memory)
        + pre_f / e.attention
        + kv_b / e.memory
        + link_lat
        + link_b / e.interconnect
        + e.overhead_s
        + prefill * e.prefill_overhead_s
    )


# ---- calibrated ----------------------------------------------------------------------------

# Settings that change what one step costs: a profile is valid only for the ones it was
# measured with. The scheduler's settings (batching, chunk size, max_num_seqs, prefix caching)
# change which steps run, not what each costs: those are what a simulation predicts across.
FORMAT = 3  # of a saved profile
COST_SETTINGS = (
    "dtype",
    "quantization",
    "kv_cache_dtype",
    "tensor_parallel_size",
    "enforce_eager",
    "attention_backend",
    "cuda_graphs",
)
BENDS = (2, 4, 8, 16, 64)  # token counts where a step's cost per token may fall
FORM = (
    "t = c0 + c_tok * max(knee, tokens) + sum_b c_bend[b] * min(tokens, b) + c_seq * seqs "
    "+ c_ctx * decode_context_tokens + c_pair * prefill_attention_pairs, one set for "
    "decode-only steps and one for steps with prefill; + gap_s"
)


@dataclass(slots=True)
class Terms:
    """A roofline in a fitted form. Below `knee` tokens a step streams every weight once
    and costs the same whatever its width (memory-bound, as on a GPU); above it, each token
    adds its matmul time (compute-bound): max(knee, tokens). Where the first tokens cost
    more than later ones (a CPU's small matmuls: 1 -> 4 rows costs more than 16 -> 19), the
    min(tokens, b) terms bend the curve down at b. Per sequence: its LM head row, metadata
    and sampling. Decodes read their whole KV (decode context); prefill chunks compute
    their attention pairs. All coefficients >= 0."""

    c0: float
    c_tok: float
    knee: float
    c_seq: float
    c_ctx: float
    c_pair: float
    c_bend: list[float] = field(default_factory=lambda: [0.0] * len(BENDS))

    def time(self, shape: StepShape) -> float:
        tokens = shape.tokens
        bends = sum(c * min(tokens, b) for c, b in zip(self.c_bend, BENDS, strict=True))
        return (
            self.c0
            + self.c_tok * max(self.knee, tokens)
            + bends
            + self.c_seq * shape.seqs
            + self.c_ctx * shape.decode_context_tokens
            + self.c_pair * shape.prefill_attention_pairs
        )


@dataclass(slots=True)
class Calibrated:
    """Step times fitted to a real engine's steps: `decode` terms for decode-only steps,
    `prefill` terms for steps with a prefill chunk (on CPU they run different compiled
    graphs; on any device, different attention kernels), and `gap_s`, the median time between
    a step's end and the next one's start while requests run (scheduling, outputs, the
    server's loop). Coefficients are non-negative, fitted on relative error (steps span
    milliseconds to seconds)."""

    decode: Terms
    prefill: Terms
    gap_s: float = 0.0
    model_name: str = ""
    device: str = "local"
    settings: dict[str, Any] = field(default_factory=dict)
    fit: dict[str, Any] = field(default_factory=dict)
    # the roofline's efficiencies fitted to the same steps: {"device", "efficiency", "error"}
    roofline: dict[str, Any] | None = None
    name: str = "calibrated"

    def efficiency(self, device: str) -> Efficiency | None:
        """The fitted roofline efficiencies, if they were measured on this device."""
        if not self.roofline or self.roofline.get("device") != device:
            return None
        return Efficiency(**self.roofline["efficiency"])

    def step_time(self, shape: StepShape) -> float:
        terms = self.prefill if shape.prefill_tokens else self.decode
        return terms.time(shape) + self.gap_s

    def describe(self) -> dict[str, Any]:
        return {"cost_model": self.name, "form": FORM, **self.to_dict()}

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("name")
        return {"format": FORMAT, **d}

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_dict(), indent=1) + "\n")
        return path

    @classmethod
    def load(cls, path: str | Path) -> Calibrated:
        try:
            d = json.loads(Path(path).read_text())
            if d.pop("format", None) != FORMAT:
                raise ValueError("made by another version: run bench calibrate again")
            return cls(Terms(**d.pop("decode")), Terms(**d.pop("prefill")), **d)
        except (OSError, ValueError, TypeError) as e:
            raise ValueError(f"calibration profile {path}: {e}") from None

    def check_settings(self, settings: dict[str, Any]) -> None:
        """Refuse engine settings that change a step's cost from the calibrated ones."""
        diff = [
            f"{k}={settings.get(k)!r} (calibrated with {self.settings.get(k)!r})"
            for k in COST_SETTINGS
            if k in self.settings and settings.get(k) != self.settings.get(k)
        ]
        if diff:
            raise ValueError(
                f"the calibration profile was measured with other settings: {', '.join(diff)}; "
                "run `bench calibrate` with these settings, or use --sim-cost-model roofline"
            )


def shape_of(row: dict[str, Any]) -> StepShape:
    """A steps.jsonl line's shape."""
    return StepShape(**{f: int(row[f]) for f in StepShape.__slots__})  # type: ignore[attr-defined]


def busy_gaps(rows: list[dict[str, Any]]) -> list[float]:
    """Time from each step's end to the next one's start, where the engine had requests
    left to run (it started the next step as soon as it could)."""
    gaps = []
    for a, b in itertools.pairwise(rows):
        if a.get("running", 0) > 0:
            gap = b["t"] - a["t"] - a["dur_s"]
            if 0 <= gap < 0.25 * max(a["dur_s"], 1e-3) + 0.005:
                gaps.append(gap)
    return gaps


def nnls(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Least squares with coefficients >= 0: drop the most negative and solve again."""
    active = list(range(x.shape[1]))
    coef = np.zeros(x.shape[1])
    while active:
        sol, *_ = np.linalg.lstsq(x[:, active], y, rcond=None)
        if (sol >= 0).all():
            coef[active] = sol
            break
        active.pop(int(np.argmin(sol)))
    return coef


def _fit_terms(shapes: list[StepShape], y: np.ndarray) -> tuple[Terms, float]:
    """The best knee (powers of two) and non-negative coefficients on relative error."""
    tokens = np.array([s.tokens for s in shapes], dtype=float)
    rest = np.array(
        [[s.seqs, s.decode_context_tokens, s.prefill_attention_pairs] for s in shapes], float
    )
    bends = np.column_stack([np.minimum(tokens, b) for b in BENDS])
    best: tuple[float, float, np.ndarray] | None = None
    for knee in [2.0**k for k in range(12)]:
        x = np.column_stack([np.ones(len(y)), np.maximum(knee, tokens), rest, bends])
        coef = nnls(x / y[:, None], np.ones(len(y)))
        err = float(np.mean(np.abs(x @ coef / y - 1)))
        if best is None or err < best[0] - 1e-12:
            best = (err, knee, coef)
    assert best is not None
    err, knee, c = best
    terms = Terms(float(c[0]), float(c[1]), knee, float(c[2]), float(c[3]), float(c[4]))
    terms.c_bend = [float(v) for v in c[5:]]
    return terms, err


def fit(
    rows: Iterable[dict[str, Any]], model_name: str = "", device: str = "local", **meta: Any
) -> Calibrated:
    """Fit the calibrated form to steps.jsonl lines (of one engine's settings): decode-only
    steps and steps with prefill apart (a kind with too few steps shares the other's fit
    over all steps)."""
    rows = [r for r in rows if r.get("dur_s") is not None and r.get("seqs")]
    missing = [f for f in StepShape.__slots__ if rows and f not in rows[0]]  # type: ignore[attr-defined]
    if missing:
        raise ValueError(f"the step log lacks {missing}: log it with this version's engine")
    if len(rows) < 20:
        raise ValueError(f"{len(rows)} steps are too few to calibrate on (need >= 20)")
    shapes = [shape_of(r) for r in rows]
    y = np.array([r["dur_s"] for r in rows])
    prefill = np.array([s.prefill_tokens > 0 for s in shapes])
    both, _ = _fit_terms(shapes, y)
    terms = {}
    for kind, mask in (("decode", ~prefill), ("prefill", prefill)):
        if mask.sum() >= 10:
            kept = [s for s, m in zip(shapes, mask, strict=True) if m]
            terms[kind], _ = _fit_terms(kept, y[mask])
        else:
            terms[kind] = both
    gaps = busy_gaps(rows)
    model = Calibrated(
        terms["decode"], terms["prefill"], float(np.median(gaps)) if gaps else 0.0,
        model_name, device,
    )  # fmt: skip
    pred = np.array([model.step_time(s) - model.gap_s for s in shapes])
    rel = np.abs(pred / y - 1)
    model.fit = {
        "steps": len(rows),
        "prefill_steps": int(prefill.sum()),
        "mean_abs_rel_err": float(rel.mean()),
        "p90_abs_rel_err": float(np.quantile(rel, 0.9)),
        "decode_mean_abs_rel_err": float(rel[~prefill].mean()) if (~prefill).any() else None,
        "prefill_mean_abs_rel_err": float(rel[prefill].mean()) if prefill.any() else None,
        "busy_gaps": len(gaps),
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
        **meta,
    }
    return model


def read_steps(path: str | Path) -> list[dict[str, Any]]:
    """A steps.jsonl file's lines; a broken line is an error naming it."""
    rows = []
    with open(path) as f:
        for i, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except ValueError as e:
                raise ValueError(f"{path}:{i}: not JSON ({e})") from None
    return rows


def default_profile_path(model: str, settings: dict[str, Any]) -> Path | None:
    """Where `bench calibrate` keeps the profile of a model x this machine x settings
    ($SERVEBENCH_CACHE_DIR/sim/...; None when the cache is off)."""
    from engine.model.sources import cache_dir

    root = cache_dir()
    if root is None:
        return None
    slug = Path(model).name if "/" in model or model.endswith(".gguf") else model
    parts = [slug] + [f"{k}={settings.get(k)}" for k in COST_SETTINGS]
    name = "__".join(str(p).replace("/", "_") for p in parts)
    return root / "sim" / f"{name}.json"
