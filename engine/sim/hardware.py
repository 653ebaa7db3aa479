"""Devices a simulation can run on: public spec-sheet peaks of datacenter GPUs, and this
machine as measured (`bench_cli/device_peak.py`). Peaks are dense (no sparsity)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

GB = 1e9


@dataclass(frozen=True, slots=True)
class DeviceSpec:
    name: str
    # Peak FLOP/s by the dtype of the matmul inputs; fp8 only where tensor cores take it.
    peak_flops: dict[str, float]
    memory_bw: float  # bytes/s (HBM, or this machine's measured read bandwidth)
    memory_bytes: float  # per device
    # One direction of one device's links (NVLink): what a ring all-reduce moves data at.
    interconnect_bw: float = 0.0
    interconnect_latency_s: float = 0.0  # per all-reduce, start-up and synchronization
    source: str = ""  # where the figures come from

    def flops(self, dtype: str) -> float:
        """Peak FLOP/s of matmuls with inputs of `dtype` (fp8 falls back to the bf16 peak on
        devices without fp8 tensor cores: the weights are upcast, as vLLM's Marlin does)."""
        if dtype in self.peak_flops:
            return self.peak_flops[dtype]
        if dtype == "fp8":
            return self.flops("bfloat16")
        if dtype == "float32" and "bfloat16" in self.peak_flops:
            return self.peak_flops["bfloat16"] / 2  # TF32 tensor cores
        raise ValueError(f"device {self.name}: no peak for {dtype}")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


NVIDIA = "NVIDIA data sheets: dense tensor-core peaks, SXM parts"

DEVICES: dict[str, DeviceSpec] = {
    "a100": DeviceSpec(
        "a100",  # A100 SXM4 80GB
        {"bfloat16": 312e12, "float32": 156e12},  # float32 as TF32
        memory_bw=2039 * GB,
        memory_bytes=80 * GB,
        interconnect_bw=300 * GB,  # NVLink 3: 600 GB/s both directions
        interconnect_latency_s=15e-6,
        source=NVIDIA,
    ),
    "h100": DeviceSpec(
        "h100",  # H100 SXM5 80GB
        {"bfloat16": 989e12, "fp8": 1979e12, "float32": 495e12},
        memory_bw=3350 * GB,
        memory_bytes=80 * GB,
        interconnect_bw=450 * GB,  # NVLink 4: 900 GB/s both directions
        interconnect_latency_s=10e-6,
        source=NVIDIA,
    ),
    "h200": DeviceSpec(
        "h200",  # H200 SXM 141GB: H100's compute, more and faster HBM3e
        {"bfloat16": 989e12, "fp8": 1979e12, "float32": 495e12},
        memory_bw=4800 * GB,
        memory_bytes=141 * GB,
        interconnect_bw=450 * GB,
        interconnect_latency_s=10e-6,
        source=NVIDIA,
    ),
    "b200": DeviceSpec(
        "b200",  # HGX B200 180GB
        {"bfloat16": 2250e12, "fp8": 4500e12, "float32": 1125e12},
        memory_bw=8000 * GB,
        memory_bytes=180 * GB,
        interconnect_bw=900 * GB,  # NVLink 5: 1.8 TB/s both directions
        interconnect_latency_s=10e-6,
        source=NVIDIA,
    ),
}


def local_device(peak: dict[str, Any], memory_bytes: float) -> DeviceSpec:
    """This machine from `device_peak`'s measurement: the best matmul of its dtype and the
    read bandwidth of a sum over a tensor far larger than the cache (how weights stream in
    a decode step). Tensor parallelism here goes over gloo (MACHINE-NOTES: ~1.5 ms each)."""
    dtype = str(peak.get("dtype", "float32"))
    return DeviceSpec(
        "local",
        {dtype: float(peak["peak_flops"])},
        memory_bw=float(peak.get("peak_read_bytes_per_s") or peak["peak_bytes_per_s"]),
        memory_bytes=memory_bytes,
        interconnect_bw=float(peak.get("peak_bytes_per_s", 0.0)) / 2,
        interconnect_latency_s=1.5e-3,
        source=f"measured here: {peak.get('machine', 'this machine')}",
    )


def builtin_device(name: str) -> DeviceSpec:
    try:
        return DEVICES[name.lower()]
    except KeyError:
        known = ", ".join([*DEVICES, "local"])
        raise ValueError(f"sim device {name!r}: expected one of {known}") from None


def gpu_device_name(gpu: str | None = None) -> str:
    """The built-in spec of a GPU by its name (e.g. "NVIDIA H200"; default: this machine's
    first CUDA GPU)."""
    if gpu is None:
        import torch

        gpu = torch.cuda.get_device_name(0)
    for known in DEVICES:
        if known in gpu.lower():
            return known
    raise ValueError(f"no built-in spec for {gpu!r}: expected one of {', '.join(DEVICES)}")
