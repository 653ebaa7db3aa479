"""Linear layers for CPU inference with the weight re-laid out once, at load: for this
project's kernel (cpu_kernels.cpp) where it can be built, else for oneDNN.

cpu_kernels.cpp's `servebench::linear` holds the weight in blocks of 16 output rows, each
k's 16 weights adjacent, and computes 6 rows of x per pass with x broadcast (on AVX-512, from
2 rows, 8 rows times 3 blocks: 24 FMA chains): at one row it streams the weights at memory
speed, at many it is bound by FMAs. Measured here it beat
oneDNN's packed product at every row count from 1 to 1024 (oneDNN pays a fixed cost a call
before it starts, and a decode step makes ~120 calls), beat MKL by more, and tied MKL at
2048 (docs/results/2026-12-04-cpu-design-choices.md). It is a C++ op, so compiled graphs
call it without Python, and keeps no state per shape. Where cpu_kernels.py cannot build it
(or `SERVEBENCH_CPU_KERNELS=0`) the engine uses oneDNN as below.

`F.linear` on CPU calls MKL's sgemm, which repacks the weight into its kernel's layout on
every call: for decode-sized inputs (a few dozen rows) that repacking costs about as much as
the product. oneDNN can keep the weight in its own blocked layout (`_reorder_linear_weight`,
the op torch's inductor uses when it freezes a CPU model; vLLM's CPU backend prepacks its
weights with oneDNN the same way). MKL's kernel is the better one for big prefill chunks,
so from `MKL_MIN_ROWS` rows the weight is unpacked for MKL, which costs little beside the
product. Figures: docs/results/2026-12-04-cpu-design-choices.md.

bfloat16 weights on a CPU with AVX512-BF16 are held as bf16 blocks of pairs for
`servebench::linear_bf16` (cpu_kernels_bf16.cpp: vdpbf16ps, float32 accumulation): half of
float32's bytes to stream a decode step, at every row count (one thread, here: 1.4-3.7x
faster than torch's bf16 product at 1-64 rows, 1.0-1.6x at 128-512; benchmarks/
bf16_decode.py measures the engine). Elsewhere bf16 linears stay torch's.

`SERVEBENCH_ONEDNN=0` keeps plain `nn.Linear`."""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F
from torch import nn

from engine.ops import cpu_kernels
from engine.ops.fp8 import FP16_FROM_FP8_FACTOR, Fp8Linear

MKL_MIN_ROWS = 1024  # where MKL's kernel starts to win over oneDNN (measured: docs/results/)
BLOCK = 16  # cpu_kernels.cpp's NB: output rows per block of its weight layout


def to_blocks(weight: torch.Tensor) -> torch.Tensor:
    """[out, in] -> [ceil(out / BLOCK), in, BLOCK], the last block zero-padded."""
    out, k = weight.shape
    padded = weight.new_zeros(-(-out // BLOCK) * BLOCK, k)
    padded[:out] = weight
    return padded.view(-1, BLOCK, k).transpose(1, 2).contiguous()


def bf16_blocks(weight: torch.Tensor) -> torch.Tensor:
    """A bf16 weight [out, in] -> [ceil(out / BLOCK), ceil(in / 2), BLOCK, 2]: for each pair of
    inputs, a block's BLOCK outputs' two weights adjacent (what one vdpbf16ps takes), zero-padded
    to whole blocks and an even input count."""
    out, k = weight.shape
    k2 = -(-k // 2)
    padded = weight.new_zeros(-(-out // BLOCK) * BLOCK, 2 * k2)
    padded[:out, :k] = weight
    return padded.view(-1, BLOCK, k2, 2).permute(0, 2, 1, 3).contiguous()


def fp8_blocks(weight: torch.Tensor, scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """An e4m3 weight [out, in] and its per-channel scales [out] as `servebench::linear_fp8`
    takes them: blocks as `to_blocks`, scales times the kernel's upcast factor, padded alike."""
    blocks = to_blocks(weight.view(torch.uint8)).view(weight.dtype)
    scales = scale.new_zeros(blocks.shape[0] * BLOCK)
    scales[: len(scale)] = scale * FP16_FROM_FP8_FACTOR
    return blocks, scales


def padded_rows(rows: int) -> int:
    """The row count a packed product runs at. torch keeps state for each input shape a packed
    weight has seen, so a server whose batches take every size from 1 to 1023 rows grew by
    gigabytes. Rows are exact up to 64 (decode batches), then rounded up to 8 steps per power
    of two (at most 1/8 more rows): 96 shapes in all below MKL_MIN_ROWS."""
    if rows <= 64:
        return rows
    step = 1 << (rows.bit_length() - 4)
    return -(-rows // step) * step


def packed_product(x: torch.Tensor, packed_weight: torch.Tensor) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(x, packed_weight, None, "none", [], "")


def packed_linear(x: torch.Tensor, packed_weight: torch.Tensor) -> torch.Tensor:
    """x [rows, in] times the packed weight: oneDNN at a bucketed row count, MKL from
    MKL_MIN_ROWS rows."""
    rows = x.shape[0]
    if rows >= MKL_MIN_ROWS:
        return F.linear(x, packed_weight.to_dense())
    padded = padded_rows(rows)
    if padded != rows:
        x = F.pad(x, (0, 0, 0, padded - rows))
    return packed_product(x, packed_weight)[:rows]


# `packed_linear` as an op that inductor calls as it is: its own lowering of
# `_linear_pointwise` wants the weight to be a constant of the graph (frozen), but the compiled
# forward passes each layer's weights in, so that one graph serves all layers. Defined with
# torch.library directly: `torch.library.custom_op` cost ~35 us more per call (120 calls a
# step), this ~7 us.
_lib = torch.library.Library("servebench", "FRAGMENT")
_lib.define("packed_linear(Tensor x, Tensor packed_weight, SymInt out_features) -> Tensor")
_lib.impl(
    "packed_linear",
    lambda x, packed_weight, out_features: packed_linear(x, packed_weight),
    "CompositeExplicitAutograd",
)


@torch.library.register_fake("servebench::packed_linear")
def _(x: torch.Tensor, packed_weight: torch.Tensor, out_features: int) -> torch.Tensor:
    return x.new_empty(x.shape[0], out_features)


def packing_enabled(dtype: torch.dtype, device: torch.device) -> bool:
    """Whether a model's linears are re-laid out at load: float32 (the kernel's blocks, or
    oneDNN's), or bf16 where `servebench::linear_bf16` runs."""
    if dtype == torch.bfloat16:
        return device.type == "cpu" and cpu_kernels.bf16_available()
    return onednn_packing_enabled(dtype, device)


def onednn_packing_enabled(dtype: torch.dtype, device: torch.device) -> bool:
    return (
        device.type == "cpu"
        and dtype == torch.float32
        and torch.backends.mkldnn.is_available()
        and os.environ.get("SERVEBENCH_ONEDNN") != "0"
    )


class PackedLinear(nn.Module):
    """A bias-free linear layer holding only its re-laid-out weight (blocks for
    `servebench::linear`, else oneDNN's layout): the plain one is freed unless something else
    holds it (a tied embedding). With `weight_scale`, an e4m3 weight (engine/ops/fp8.py) in
    blocks for `servebench::linear_fp8`, which upcasts it in registers: the kernel only. A bf16
    weight: blocks of pairs for `servebench::linear_bf16` (AVX512-BF16 only)."""

    def __init__(self, weight: torch.Tensor, weight_scale: torch.Tensor | None = None) -> None:
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.native = cpu_kernels.available()
        w = weight.detach()
        scales = None
        if weight_scale is not None:
            if not self.native:
                raise ValueError("e4m3 weights are packed for the engine's kernel only")
            packed, scales = fp8_blocks(w, weight_scale)
        elif w.dtype == torch.bfloat16:
            if not cpu_kernels.bf16_available():
                raise ValueError("bf16 weights are packed for servebench::linear_bf16 only")
            packed = bf16_blocks(w)
        elif self.native:
            packed = to_blocks(w)
        else:
            packed = torch.ops.mkldnn._reorder_linear_weight(w)
        self.register_buffer("packed_weight", packed, persistent=False)
        self.register_buffer("weight_scale", scales, persistent=False)

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> PackedLinear:
        if linear.bias is not None:
            raise ValueError("PackedLinear has no bias (Llama's linears have none)")
        return cls(linear.weight)

    @classmethod
    def from_fp8(cls, linear: Fp8Linear) -> PackedLinear:
        return cls(linear.weight, linear.weight_scale)

    def plain_weight(self) -> torch.Tensor:
        """The weight as [out, in] again, from the kernel's float32 or bf16 blocks (tests use
        it to compute a layer's exact float32 reference)."""
        w, out, k = self.packed_weight, self.out_features, self.in_features
        if self.weight_scale is None and w.dtype == torch.bfloat16:  # [nb, k2, BLOCK, 2]
            return w.permute(0, 2, 1, 3).reshape(w.shape[0] * BLOCK, -1)[:out, :k].contiguous()
        if self.weight_scale is None and self.native:  # [nb, k, BLOCK]
            return w.transpose(1, 2).reshape(-1, k)[:out].contiguous()
        raise ValueError(f"no plain weight kept for {self.extra_repr()}")

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [rows, in_features]
        if self.weight_scale is not None:
            return torch.ops.servebench.linear_fp8(
                x, self.packed_weight, self.weight_scale, self.out_features
            )
        if self.packed_weight.dtype == torch.bfloat16:
            return torch.ops.servebench.linear_bf16(x, self.packed_weight, self.out_features)
        if self.native:
            return torch.ops.servebench.linear(x, self.packed_weight, self.out_features)
        if torch.compiler.is_compiling():
            return torch.ops.servebench.packed_linear(x, self.packed_weight, self.out_features)
        return packed_linear(x, self.packed_weight)

    def extra_repr(self) -> str:
        layout = "servebench::linear blocks" if self.native else "oneDNN packed"
        if self.weight_scale is not None:
            layout = "servebench::linear_fp8 blocks, fp8_e4m3"
        elif self.packed_weight.dtype == torch.bfloat16:
            layout = "servebench::linear_bf16 blocks"
        return f"in_features={self.in_features}, out_features={self.out_features}, {layout}"
