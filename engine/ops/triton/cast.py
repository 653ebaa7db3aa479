"""What the kernels share: the interpreter switch, the dot settings, and a cast that is exact in
Triton's interpreter.

The interpreter (triton 3.9) rounds float32 -> bfloat16 by truncation and float32 -> e4m3
without carrying a mantissa overflow into the exponent (126.2 becomes 64, not 128):
../shared/MACHINE-NOTES.md. `cast` rounds such values to nearest-even by hand first when
INTERPRET is set, so that the conversion it leaves to the interpreter is exact; compiled
kernels convert in hardware and skip it. Its `tl.dot` on bfloat16 is wrong too: kernels
multiply in float32 there (`dot_dtype`)."""

from __future__ import annotations

from collections.abc import Callable

import torch
import triton
import triton.language as tl

INTERPRET = bool(triton.knobs.runtime.interpret)


def device_function(fn: Callable) -> Callable:
    """A helper that kernels call: jit-compiled for the GPU, but plain Python under the
    interpreter, which re-patches triton.language on each call of a jit helper (~2-50 ms a
    call measured, most of the interpreter's time in these kernels)."""
    return fn if INTERPRET else triton.jit(fn)


def dot_dtype(dtype: torch.dtype) -> tl.dtype:
    """What a kernel's tl.dot multiplies in: the data's dtype, float32 in the interpreter."""
    if INTERPRET or dtype == torch.float32:
        return tl.float32
    return {torch.bfloat16: tl.bfloat16, torch.float16: tl.float16}[dtype]


def dot_precision(dtype: torch.dtype) -> str | None:
    """float32 products stay IEEE on GPUs (tl.dot's default would take TF32)."""
    return "ieee" if dtype == torch.float32 else None


@device_function
def _round_bf16(x):
    """float32 -> the nearest bfloat16 value (ties to even), still as float32."""
    bits = x.to(tl.int32, bitcast=True)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & -65536  # -65536: 0xFFFF0000
    return bits.to(tl.float32, bitcast=True)


@device_function
def _round_e4m3(x):
    """float32 in [-448, 448] -> the nearest e4m3 value (ties to even), still as float32:
    a power-of-two spacing of 2**(exponent - 3), 2**-9 below e4m3's normals."""
    bits = x.to(tl.int32, bitcast=True)
    exponent = ((bits >> 23) & 0xFF) - 127
    spacing = ((tl.maximum(exponent, -6) - 3 + 127) << 23).to(tl.float32, bitcast=True)
    steps = x / spacing  # exact: |steps| < 16
    magic = 12582912.0  # 1.5 * 2**23: adding and taking it away rounds to an integer, ties even
    rounded = ((steps + magic) - magic) * spacing
    return tl.where(bits < 0, -tl.abs(rounded), rounded)  # the sign of a zero too, as torch


@device_function
def cast(x, dtype: tl.constexpr, interpret: tl.constexpr):
    """float32 values to `dtype`, rounded to nearest-even in the interpreter too."""
    if interpret:
        if dtype == tl.bfloat16:
            x = _round_bf16(x)
        elif dtype == tl.float8e4nv:
            x = _round_e4m3(x)
    return x.to(dtype)
