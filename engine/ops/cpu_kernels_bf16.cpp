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
// blocks are split over torch's threads, as servebench::linear's float32 blocks are.

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/constant_pad_nd.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define SERVEBENCH_BF16_X86 1
#include <immintrin.h>
#define BF16_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")))
#endif

namespace {

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

// Blocks [begin, end) for every row of x: what one thread computes.
BF16_TARGET void blocks_range(int64_t begin, int64_t end, const int32_t* x, int64_t m,
                              int64_t k2, const uint16_t* w, uint16_t* y, int64_t n) {
  for (int64_t b = begin; b < end; ++b) {
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
    at::parallel_for(0, blocks.size(0), 4, [&](int64_t begin, int64_t end) {
      blocks_range(begin, end, xp, m, k2, wp, yp, n);
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
