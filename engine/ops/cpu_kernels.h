// Shared by the engine's CPU kernels (cpu_kernels.cpp: linears; cpu_attention.cpp: decode
// attention): ATen's float vector for the capability the file is built for, the weight block
// width, and how each stored dtype loads NB values into float32 registers.
#pragma once

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <c10/util/Float8_e4m3fn.h>
#include <torch/library.h>

#include "cpu_pool.h"

#if defined(CPU_CAPABILITY_AVX2) || defined(CPU_CAPABILITY_AVX512)
#include <immintrin.h>
#endif

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

namespace {

using servebench_pool::parallel_for;  // at::parallel_for's contract, on the kernels' pool
using Vec = at::vec::Vectorized<float>;
constexpr int64_t NB = 16;  // weight rows per block
constexpr int64_t NV = NB / Vec::size();

// Float32 weights: one block row is NV vectors.
struct F32 {
  using T = float;
  static constexpr int64_t MR = 6;  // rows of x per pass: MR * NB / 8 = 12 accumulators on AVX2
  static void load(const float* p, Vec* w) {
    for (int64_t v = 0; v < NV; ++v) w[v] = Vec::loadu(p + v * Vec::size());
  }
};

// e4m3 weights, upcast in registers: each byte sign-extended to 16 bits, shifted left by 7 and
// masked to sign and low 14 bits is a float16 of 1/256 the fp8 value (engine/ops/fp8.py's
// `upcast`; exact for every finite code, subnormals too), which F16C converts to float32. The
// 256 goes into the per-channel scales. A quarter of float32's bytes to stream: what a decode
// step at few sequences waits on.
struct Fp8 {
  using T = uint8_t;
  // Upcast in registers for up to 3 rows; from 4 the block is upcast once (blocked_linear):
  // 6.7 / 7.1 / 10.1 / 13.5 ms for 1-4 rows through 30 SmolLM2 layers in registers, 12.6 /
  // 13.4 / 13.8 ms for 2-4 upcast once (float32: ~15).
  static constexpr int64_t MR = 3;
  static void load(const uint8_t* p, Vec* w) {
#if defined(CPU_CAPABILITY_AVX2) || defined(CPU_CAPABILITY_AVX512)
    const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    const __m256i halves = _mm256_and_si256(_mm256_slli_epi16(_mm256_cvtepi8_epi16(bytes), 7),
                                            _mm256_set1_epi16(static_cast<int16_t>(0xBF80)));
#if defined(CPU_CAPABILITY_AVX512)
    w[0] = Vec(_mm512_cvtph_ps(halves));
#else
    w[0] = Vec(_mm256_cvtph_ps(_mm256_castsi256_si128(halves)));
    w[1] = Vec(_mm256_cvtph_ps(_mm256_extracti128_si256(halves, 1)));
#endif
#else
    static const std::array<float, 256> table = [] {
      std::array<float, 256> t{};
      for (int i = 0; i < 256; ++i)
        t[i] = static_cast<float>(c10::Float8_e4m3fn(i, c10::Float8_e4m3fn::from_bits())) / 256;
      return t;
    }();
    float f[NB];
    for (int64_t i = 0; i < NB; ++i) f[i] = table[p[i]];
    for (int64_t v = 0; v < NV; ++v) w[v] = Vec::loadu(f + v * Vec::size());
#endif
  }
};

// bfloat16 values (a bf16 KV cache): each is the top half of a float32, so widening to 32 bits
// and shifting left by 16 is exact, with no bf16 instruction (AVX2 builds run it too).
struct Bf16 {
  using T = uint16_t;
  static void load(const uint16_t* p, Vec* w) {
#if defined(CPU_CAPABILITY_AVX512)
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    w[0] = Vec(_mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)));
#elif defined(CPU_CAPABILITY_AVX2)
    for (int64_t v = 0; v < NV; ++v) {
      const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + v * 8));
      w[v] = Vec(_mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16)));
    }
#else
    float f[NB];
    for (int64_t i = 0; i < NB; ++i) {
      const uint32_t bits = static_cast<uint32_t>(p[i]) << 16;
      std::memcpy(f + i, &bits, 4);
    }
    for (int64_t v = 0; v < NV; ++v) w[v] = Vec::loadu(f + v * Vec::size());
#endif
  }
};

}  // namespace
