"""The roofline's efficiencies fitted to a real engine's steps on the device it ran on: the
fractions of the peaks its kernels reach and its per-step overhead. Unlike the calibrated
form, which holds for one model, these carry to other models on the same device (and to the
same kind of device elsewhere): `bench calibrate` stores them in its profile and `--sim-cost-model
roofline --sim-profile P` uses them."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from engine.sim.step_time import Efficiency, Roofline, nnls, roofline_time, shape_of

BOUNDS = {"compute": (0.01, 1.0), "memory": (0.01, 1.0), "attention": (0.005, 1.0)}


def fit_efficiency(
    rows: list[dict[str, Any]], roofline: Roofline, gap_s: float = 0.0
) -> tuple[Efficiency, float]:
    """Efficiencies that minimise the relative error of the roofline over the steps, and the
    mean relative error. With each max() settled (which of a kernel's compute and memory time
    is the longer), a step's time is linear in 1/compute, 1/memory, 1/attention and the
    overheads (every step's, and the extra of a step with prefill): fitted with non-negative
    least squares, the max()es settled again with the new efficiencies, until they stay.
    Links keep their assumed efficiency (one device's steps cannot show them). `gap_s` (the
    engine's time between steps) is added to each step: the roofline's overhead covers it."""
    shapes = [shape_of(r) for r in rows]
    y = np.array([r["dur_s"] for r in rows]) + gap_s
    lin_f, lin_b, head_f, head_b, dec_f, dec_b, pre_f, kv_b, link_lat, link_b, prefill = (
        np.array(col) for col in zip(*(roofline.parts(s) for s in shapes), strict=True)
    )
    eff = roofline.eff
    rest = np.maximum(y - link_lat - link_b / eff.interconnect, 1e-9)
    # the extra of steps with prefill: only where some steps have prefill and some have not
    apart = 0.0 < prefill.mean() < 1.0
    kernels = ((lin_f, lin_b), (head_f, head_b), (dec_f, dec_b))
    seen: set[bytes] = set()
    for _ in range(50):
        compute_wins = [f / eff.compute >= b / eff.memory for f, b in kernels]
        key = np.packbits(np.concatenate(compute_wins)).tobytes()
        if key in seen:
            break
        seen.add(key)
        flops = sum(np.where(w, f, 0.0) for w, (f, _) in zip(compute_wins, kernels, strict=True))
        bytes_ = kv_b + sum(
            np.where(w, 0.0, b) for w, (_, b) in zip(compute_wins, kernels, strict=True)
        )
        x = np.column_stack([flops, bytes_, pre_f, np.ones(len(y)), prefill if apart else 0 * y])
        coef = nnls(x / rest[:, None], np.ones(len(y)))
        eff = replace(
            eff,
            compute=_inverse(coef[0], flops, eff.compute, "compute"),
            memory=_inverse(coef[1], bytes_, eff.memory, "memory"),
            attention=_inverse(coef[2], pre_f, eff.attention, "attention"),
            overhead_s=float(coef[3]),
            prefill_overhead_s=float(coef[4]),
        )
    parts = (lin_f, lin_b, head_f, head_b, dec_f, dec_b, pre_f, kv_b, link_lat, link_b, prefill)
    return eff, float(np.mean(np.abs(roofline_time(parts, eff) / y - 1)))


def _inverse(coef: float, column: np.ndarray, before: float, name: str) -> float:
    """An efficiency from its fitted inverse; unchanged where no step shows the part."""
    if not column.any():
        return before
    lo, hi = BOUNDS[name]
    return float(min(max(1.0 / coef, lo), hi)) if coef > 0 else hi
