"""Compile every Triton kernel for an sm_90 GPU (H100/H200) without one: Triton's compiler and
the ptxas it ships run on any Linux host. Run by test_triton_compile.py (beside it) in a process
of its own, where triton is imported before engine.ops so that nothing is interpreted. Prints
one line per kernel configuration; exits 1 if any fails to compile."""

from __future__ import annotations

import os
import sys

os.environ.pop("TRITON_INTERPRET", None)
import triton  # before engine.ops, which would set the interpreter up
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from engine.ops.triton import attention, cast, kv_cache, norm, rotary

assert not cast.INTERPRET
TARGET = GPUTarget("cuda", 90, 32)
failed = []


def build(fn: triton.JITFunction, types: dict[str, str], consts: dict, tag: str) -> None:
    signature = {n: "constexpr" if n in consts else types[n] for n in fn.arg_names}
    try:
        kernel = triton.compile(ASTSource(fn, signature, consts), target=TARGET,
                                options={"num_warps": 4})  # fmt: skip
        print(f"ok   {tag}: {len(kernel.asm['cubin'])} bytes of sm_90 code", flush=True)
    except Exception as e:
        failed.append(tag)
        print(f"FAIL {tag}: {type(e).__name__}: {str(e)[-1200:]}", flush=True)


def ints(names: str) -> dict[str, str]:
    return dict.fromkeys(names.split(), "i32")


def attention_kernel(
    tag: str, q: str, c: str, group: int, dim: int, fp8: bool, segments: int = 1
) -> None:
    scale = "*fp32" if fp8 else f"*{q}"
    part = "*fp32" if segments > 1 else f"*{q}"
    types = {"out_ptr": f"*{q}", "q_ptr": f"*{q}", "k_cache_ptr": f"*{c}", "v_cache_ptr": f"*{c}",
             "k_scale_ptr": scale, "v_scale_ptr": scale, "block_tables_ptr": "*i32",
             "seq_lens_ptr": "*i32", "query_start_ptr": "*i32", "part_acc_ptr": part,
             "part_m_ptr": part, "part_total_ptr": part, "scale": "fp32"}  # fmt: skip
    types |= ints("num_seqs num_heads head_dim stride_qt stride_qh stride_ot stride_oh "
                  "stride_ch stride_cb stride_cs stride_bt")  # fmt: skip
    block_m = max(16, triton.next_power_of_2(group))
    dot = tl.float32 if q == "fp32" else tl.bfloat16
    consts = {"GROUP": group, "BLOCK_Q": block_m // group, "BLOCK_M": block_m, "BLOCK_SIZE": 16,
              "TILE": 32, "DIM": max(16, triton.next_power_of_2(dim)), "FP8": fp8,
              "SEGMENTS": segments, "DOT_DTYPE": dot, "PRECISION": "ieee" if q == "fp32" else None,
              "INTERPRET": False}  # fmt: skip
    build(attention._attention_kernel, types, consts, tag)


attention_kernel("attention bf16, GQA 3, head_dim 64", "bf16", "bf16", 3, 64, False)
attention_kernel("attention bf16, GQA 8, head_dim 128", "bf16", "bf16", 8, 128, False)
attention_kernel("attention bf16, fp8 cache, MHA", "bf16", "fp8e4nv", 1, 64, True)
attention_kernel("attention fp32 (IEEE dots), bf16 cache", "fp32", "bf16", 3, 64, False)
attention_kernel("attention bf16, 16 key slices", "bf16", "bf16", 3, 64, False, segments=16)
types = {"out_ptr": "*bf16", "part_acc_ptr": "*fp32", "part_m_ptr": "*fp32",
         "part_total_ptr": "*fp32"} | ints("num_heads head_dim stride_ot stride_oh")  # fmt: skip
consts = {"SEGMENTS": 16, "DIM": 64, "INTERPRET": False}
build(attention._merge_segments, types, consts, "merge of key slices")

for src, dst, fp8 in (("bf16", "fp8e4nv", True), ("fp32", "bf16", False)):
    scale = "*fp32" if fp8 else f"*{src}"
    types = {
        "k_cache_ptr": f"*{dst}",
        "v_cache_ptr": f"*{dst}",
        "k_ptr": f"*{src}",
        "v_ptr": f"*{src}",
        "k_scale_ptr": scale,
        "v_scale_ptr": scale,
        "slots_ptr": "*i64",
    }
    types |= ints("num_rows num_heads head_dim stride_kt stride_kh stride_vt stride_vh "
                  "stride_ch stride_cb stride_cs")  # fmt: skip
    consts = {"ROWS": kv_cache.ROWS, "BLOCK_SIZE": 16, "DIM": 64, "FP8": fp8, "FP8_MAX": 448.0,
              "INTERPRET": False}  # fmt: skip
    build(kv_cache._write_kernel, types, consts, f"KV-cache write {src} -> {dst}")

for residual in (True, False):
    types = {n: "*bf16" for n in ("out_ptr", "sum_ptr", "x_ptr", "residual_ptr", "weight_ptr")}
    types |= {"eps": "fp32"} | ints("num_rows hidden stride_x stride_r stride_out stride_sum")
    consts = {"HAS_RESIDUAL": residual, "ROWS": norm.ROWS, "BLOCK": 1024, "INTERPRET": False}
    build(norm._rms_norm_kernel, types, consts, f"RMSNorm bf16, residual {residual}")

for dtype in ("bf16", "fp32"):
    types = {n: f"*{dtype}" for n in ("q_out_ptr", "q_ptr", "k_out_ptr", "k_ptr", "cs_ptr")}
    types |= ints(
        "tokens num_q_heads num_k_heads half q_programs stride_qt stride_qh "
        "stride_qot stride_qoh stride_kt stride_kh stride_kot stride_koh stride_cs"
    )
    consts = {"ROWS": rotary.ROWS, "HALF": 64, "INTERPRET": False}
    build(rotary._rotary_kernel, types, consts, f"rotary {dtype}")

sys.exit(1 if failed else 0)
