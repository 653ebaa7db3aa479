// servebench::linear_bf16: y = x W^T for bfloat16 x and W, float32 accumulation through
// AVX512-BF16's vdpbf16ps, y rounded to bfloat16 (as torch's bf16 product rounds it). Built with
// the other kernels by engine/ops/cpu_kernels.py.
//
// This file is compiled with the flags of the CPU capability torch runs (AVX2 on CPUs without
// AVX-512): only the functions marked BF16_TARGET may use AVX-512 and bf16 instructions, and
// they are reached only after a run-time check of the CPU (`cpu_has_bf16`): on an AVX2-only CPU
// the op raises instead of executing an illegal instruction (cpu_linear.py never calls it there).
//
// The weight is held as bf16 (half of float32's bytes to stream per decode step) in blocks of
// NB = 16 output rows, [ceil(n / 16), ceil(k / 2), 16, 2] (engine/ops/cpu_linear.py's
// `bf16_blocks`): for each pair of k, a block's 16 outputs' two weights are adjacent, which is
// one 64-byte vector that vdpbf16ps multiplies with the pair (x[k], x[k+1]) broadcast, summing
// the two products into each output's float32 accumulator. MR rows of x share each weight load;
// blocks are split over the kernels' threads, as servebench::linear's float32 blocks are.

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/constant_pad_nd.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include "cpu_pool.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define SERVEBENCH_BF16_X86 1
#include <immintrin.h>
#define BF16_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")))
#endif

namespace {

using servebench_pool::parallel_for;

constexpr int64_t NB = 16;  // output rows per block
constexpr int64_t MR = 8;   // rows of x per pass: 8 accumulators, one weight load for all

bool cpu_has_bf16() {
#if defined(SERVEBENCH_BF16_X86)
  static const bool ok = __builtin_cpu_supports("avx512bf16") &&
                         __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl");
  return ok;
#else
  return false;
#endif
}

#if defined(SERVEBENCH_BF16_X86)
// Rows [0, M) of x (as bf16 pairs, k2 of them a row) times one block: y[i, 0:cols]. Up to 4 rows
// the pairs alternate between two sets of accumulators: one row's single chain of dependent
// vdpbf16ps would wait on each one's latency instead of on memory.
template <int64_t M>
BF16_TARGET void tile(const int32_t* x, int64_t k2, const uint16_t* block, uint16_t* y,
                      int64_t ldy, int64_t cols) {
  constexpr int64_t S = M <= 4 ? 2 : 1;
  __m512 acc[S][M];
  for (int64_t s = 0; s < S; ++s)
    for (int64_t i = 0; i < M; ++i) acc[s][i] = _mm512_setzero_ps();
  int64_t j = 0;
  for (; j + S <= k2; j += S)
    for (int64_t s = 0; s < S; ++s) {
      const __m512bh w = (__m512bh)_mm512_loadu_si512(block + (j + s) * 2 * NB);
      for (int64_t i = 0; i < M; ++i)
        acc[s][i] = _mm512_dpbf16_ps(acc[s][i], (__m512bh)_mm512_set1_epi32(x[i * k2 + j + s]), w);
    }
  for (; j < k2; ++j) {  // an odd count of pairs, two sets
    const __m512bh w = (__m512bh)_mm512_loadu_si512(block + j * 2 * NB);
    for (int64_t i = 0; i < M; ++i)
      acc[0][i] = _mm512_dpbf16_ps(acc[0][i], (__m512bh)_mm512_set1_epi32(x[i * k2 + j]), w);
  }
  for (int64_t i = 0; i < M; ++i) {
    __m512 sum = acc[0][i];
    if constexpr (S == 2) sum = _mm512_add_ps(sum, acc[1][i]);
    const __m256i out = (__m256i)_mm512_cvtneps_pbh(sum);  // round to nearest even
    if (cols == NB) {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(y + i * ldy), out);
    } else {  // the padded last block
      uint16_t tmp[NB];
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(tmp), out);
      std::memcpy(y + i * ldy, tmp, cols * sizeof(uint16_t));
    }
  }
}

BF16_TARGET void tile_rows(int64_t rows, const int32_t* x, int64_t k2, const uint16_t* block,
                           uint16_t* y, int64_t ldy, int64_t cols) {
  switch (rows) {
    case 1: return tile<1>(x, k2, block, y, ldy, cols);
    case 2: return tile<2>(x, k2, block, y, ldy, cols);
    case 3: return tile<3>(x, k2, block, y, ldy, cols);
    case 4: return tile<4>(x, k2, block, y, ldy, cols);
    case 5: return tile<5>(x, k2, block, y, ldy, cols);
    case 6: return tile<6>(x, k2, block, y, ldy, cols);
    case 7: return tile<7>(x, k2, block, y, ldy, cols);
    case 8: return tile<8>(x, k2, block, y, ldy, cols);
  }
}

// Rows [0, M) times NBK adjacent whole blocks: M * NBK accumulators. One block's 8 rows are
// 8 chains of dependent vdpbf16ps, too few to cover its latency on both FMA pipes (~60 % of
// torch's oneDNN product at prefill's row counts); 3 blocks x 8 rows are 24, each row's x pair
// broadcast once for the three weight loads.
template <int64_t M, int64_t NBK>
BF16_TARGET void wide_tile(const int32_t* x, int64_t k2, const uint16_t* block, uint16_t* y,
                           int64_t ldy) {
  __m512 acc[NBK][M];
  for (int64_t b = 0; b < NBK; ++b)
    for (int64_t i = 0; i < M; ++i) acc[b][i] = _mm512_setzero_ps();
  const int64_t stride = k2 * 2 * NB;  // one block's elements
  for (int64_t j = 0; j < k2; ++j) {
    __m512bh w[NBK];
    for (int64_t b = 0; b < NBK; ++b)
      w[b] = (__m512bh)_mm512_loadu_si512(block + b * stride + j * 2 * NB);
    for (int64_t i = 0; i < M; ++i) {
      const __m512bh xi = (__m512bh)_mm512_set1_epi32(x[i * k2 + j]);
      for (int64_t b = 0; b < NBK; ++b) acc[b][i] = _mm512_dpbf16_ps(acc[b][i], xi, w[b]);
    }
  }
  for (int64_t b = 0; b < NBK; ++b)
    for (int64_t i = 0; i < M; ++i)
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(y + i * ldy + b * NB),
                          (__m256i)_mm512_cvtneps_pbh(acc[b][i]));
}

constexpr int64_t WIDE = 3;       // blocks per wide tile
constexpr int64_t WIDE_ROWS = MR;  // from one pass of 8 rows: 6 % faster there (streamed)

BF16_TARGET void wide_rows(int64_t rows, const int32_t* x, int64_t k2, const uint16_t* block,
                           uint16_t* y, int64_t ldy) {
  switch (rows) {
    case 1: return wide_tile<1, WIDE>(x, k2, block, y, ldy);
    case 2: return wide_tile<2, WIDE>(x, k2, block, y, ldy);
    case 3: return wide_tile<3, WIDE>(x, k2, block, y, ldy);
    case 4: return wide_tile<4, WIDE>(x, k2, block, y, ldy);
    case 5: return wide_tile<5, WIDE>(x, k2, block, y, ldy);
    case 6: return wide_tile<6, WIDE>(x, k2, block, y, ldy);
    case 7: return wide_tile<7, WIDE>(x, k2, block, y, ldy);
    case 8: return wide_tile<8, WIDE>(x, k2, block, y, ldy);
  }
}

// Blocks [begin, end) for every row of x: what one thread computes. Many rows: WIDE whole
// blocks at a time while they last, then one at a time (the padded last block among them).
BF16_TARGET void blocks_range(int64_t begin, int64_t end, const int32_t* x, int64_t m,
                              int64_t k2, const uint16_t* w, uint16_t* y, int64_t n) {
  int64_t b = begin;
  if (m >= WIDE_ROWS)
    for (; b + WIDE <= end && (b + WIDE) * NB <= n; b += WIDE)
      for (int64_t i = 0; i < m; i += MR)
        wide_rows(std::min(MR, m - i), x + i * k2, k2, w + b * k2 * 2 * NB, y + i * n + b * NB,
                  n);
  for (; b < end; ++b) {
    const int64_t cols = std::min(NB, n - b * NB);
    const uint16_t* block = w + b * k2 * 2 * NB;
    for (int64_t i = 0; i < m; i += MR)
      tile_rows(std::min(MR, m - i), x + i * k2, k2, block, y + i * n + b * NB, n, cols);
  }
}
#endif

at::Tensor linear_bf16(const at::Tensor& x_in, const at::Tensor& blocks, int64_t n) {
  TORCH_CHECK(cpu_has_bf16(), "servebench::linear_bf16 needs a CPU with AVX512-BF16");
  TORCH_CHECK(x_in.dim() == 2 && blocks.dim() == 4 && blocks.size(2) == NB &&
                  blocks.size(3) == 2 && blocks.size(1) == (x_in.size(1) + 1) / 2 &&
                  blocks.size(0) == (n + NB - 1) / NB,
              "servebench::linear_bf16: x [m, k] and blocks [ceil(n / ", NB,
              "), ceil(k / 2), 16, 2], got ", x_in.sizes(), ", ", blocks.sizes(), " and n = ", n);
  TORCH_CHECK(x_in.scalar_type() == at::kBFloat16 && blocks.scalar_type() == at::kBFloat16 &&
                  blocks.is_contiguous(),
              "servebench::linear_bf16: bfloat16 x and contiguous bfloat16 blocks only");
  at::Tensor x = x_in.contiguous();
  if (x.size(1) % 2 != 0) x = at::constant_pad_nd(x, {0, 1});  // a zero to pair the last k
  const int64_t m = x.size(0), k2 = x.size(1) / 2;
  at::Tensor y = at::empty({m, n}, x.options());
#if defined(SERVEBENCH_BF16_X86)
  const auto* xp = static_cast<const int32_t*>(x.const_data_ptr());
  const auto* wp = static_cast<const uint16_t*>(blocks.const_data_ptr());
  auto* yp = static_cast<uint16_t*>(y.data_ptr());
  if (m > 0)
    // Threads take whole wide tiles (groups of WIDE blocks), the last group maybe short.
    parallel_for(0, (blocks.size(0) + WIDE - 1) / WIDE, 1, [&](int64_t begin, int64_t end) {
      blocks_range(begin * WIDE, std::min(end * WIDE, blocks.size(0)), xp, m, k2, wp, yp, n);
    });
#endif
  return y;
}

bool has_bf16_kernel() { return cpu_has_bf16(); }

}  // namespace

TORCH_LIBRARY_FRAGMENT(servebench, m) {
  m.def("linear_bf16(Tensor x, Tensor blocks, int out_features) -> Tensor");
  m.def("has_bf16_kernel() -> bool", has_bf16_kernel);  // no tensors: a catch-all kernel
}

TORCH_LIBRARY_IMPL(servebench, CPU, m) { m.impl("linear_bf16", linear_bf16); }
