// The engine's CPU kernels (float32 activations), built and registered by
// engine/ops/cpu_kernels.py.
//
// servebench::linear (float32 weights) and servebench::linear_fp8 (e4m3 weights, per-channel
// scales): y = x W^T for every row count, with the weight re-laid out once at load
// (engine/ops/cpu_linear.py).
//
// The weight is held in blocks of NB output rows, [ceil(n / NB), k, NB] (the last block
// zero-padded): for each k a block's NB weights are adjacent, so MR rows of x times one block is
// MR * NB / Vec::size() vector FMAs per k, x[k] broadcast, no horizontal sums, and each weight
// load serves MR rows. At one row that streams the weights at memory speed; at many rows it is
// bound by FMAs. Blocks are split over torch's threads (at::parallel_for, OpenMP); each block
// is read from memory once and from cache for the next MR rows of x. Vectorized through ATen's
// vec types, so the same source builds for AVX2 or AVX-512 (cpu_kernels.py sets the macros).

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <c10/util/Float8_e4m3fn.h>
#include <torch/library.h>

#if defined(CPU_CAPABILITY_AVX2) || defined(CPU_CAPABILITY_AVX512)
#include <immintrin.h>
#endif

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

namespace {

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

// Rows [0, M) of x times one block: y[i, 0:cols] for each row i, times the block's per-column
// scales where there are any.
template <typename W, int64_t M>
void tile(const float* x, int64_t k, const typename W::T* block, const float* scales, float* y,
          int64_t ldy, int64_t cols) {
  Vec acc[M][NV];
  for (int64_t i = 0; i < M; ++i)
    for (int64_t v = 0; v < NV; ++v) acc[i][v] = Vec(0.f);
  for (int64_t j = 0; j < k; ++j) {
    Vec w[NV];
    W::load(block + j * NB, w);
    for (int64_t i = 0; i < M; ++i) {
      const Vec xj(x[i * k + j]);
      for (int64_t v = 0; v < NV; ++v) acc[i][v] = at::vec::fmadd(xj, w[v], acc[i][v]);
    }
  }
  for (int64_t i = 0; i < M; ++i) {
    if (scales != nullptr)
      for (int64_t v = 0; v < NV; ++v) acc[i][v] = acc[i][v] * Vec::loadu(scales + v * Vec::size());
    if (cols == NB) {
      for (int64_t v = 0; v < NV; ++v) acc[i][v].store(y + i * ldy + v * Vec::size());
    } else {  // the padded last block
      float out[NB];
      for (int64_t v = 0; v < NV; ++v) acc[i][v].store(out + v * Vec::size());
      std::copy(out, out + cols, y + i * ldy);
    }
  }
}

template <typename W>
void tile_rows(int64_t rows, const float* x, int64_t k, const typename W::T* block,
               const float* scales, float* y, int64_t ldy, int64_t cols) {
  static_assert(W::MR <= 6);
  switch (rows) {
    case 1: return tile<W, 1>(x, k, block, scales, y, ldy, cols);
    case 2: return tile<W, 2>(x, k, block, scales, y, ldy, cols);
    case 3: return tile<W, 3>(x, k, block, scales, y, ldy, cols);
    case 4: return tile<W, 4>(x, k, block, scales, y, ldy, cols);
    case 5: if constexpr (W::MR >= 5) return tile<W, 5>(x, k, block, scales, y, ldy, cols);
            break;
    case 6: if constexpr (W::MR >= 6) return tile<W, 6>(x, k, block, scales, y, ldy, cols);
            break;
  }
  TORCH_CHECK(false, "servebench::linear: ", rows, " rows in one tile");
}

// x [m, k] times blocks [ceil(n / NB), k, NB]: blocks split over torch's threads, each block
// read from memory once and from cache for the next MR rows of x.
template <typename W>
at::Tensor blocked_linear(const at::Tensor& x_in, const at::Tensor& blocks, const float* scales,
                          int64_t n) {
  TORCH_CHECK(x_in.dim() == 2 && blocks.dim() == 3 && blocks.size(2) == NB &&
                  x_in.size(1) == blocks.size(1) && blocks.size(0) == (n + NB - 1) / NB,
              "servebench::linear: x [m, k] and blocks [ceil(n / ", NB, "), k, ", NB, "], got ",
              x_in.sizes(), ", ", blocks.sizes(), " and n = ", n);
  TORCH_CHECK(x_in.scalar_type() == at::kFloat && blocks.is_contiguous(),
              "servebench::linear: float32 x and contiguous blocks only");
  const at::Tensor x = x_in.contiguous();
  const int64_t m = x.size(0), k = x.size(1);
  at::Tensor y = at::empty({m, n}, x.options());
  const float* xp = x.data_ptr<float>();
  const auto* wp = static_cast<const typename W::T*>(blocks.const_data_ptr());
  float* yp = y.data_ptr<float>();
  // Past one pass of rows, a low-precision block is upcast once into a float32 one (in L1 or
  // L2) that the float32 tiles then read: upcast in registers for every pass of rows, the
  // FMAs waited on the conversions (64 rows: 1.5x float32's time; upcast once, 0.97x).
  const bool upcast_once = !std::is_same_v<W, F32> && m > W::MR;
  at::parallel_for(0, blocks.size(0), 4, [&](int64_t begin, int64_t end) {
    std::vector<float> upcast(upcast_once ? k * NB : 0);
    for (int64_t b = begin; b < end; ++b) {
      const int64_t cols = std::min(NB, n - b * NB);
      const float* s = scales == nullptr ? nullptr : scales + b * NB;
      const typename W::T* block = wp + b * k * NB;
      if (upcast_once) {
        for (int64_t j = 0; j < k; ++j) {
          Vec w[NV];
          W::load(block + j * NB, w);
          for (int64_t v = 0; v < NV; ++v) w[v].store(upcast.data() + j * NB + v * Vec::size());
        }
        for (int64_t i = 0; i < m; i += F32::MR)
          tile_rows<F32>(std::min(F32::MR, m - i), xp + i * k, k, upcast.data(), s,
                         yp + i * n + b * NB, n, cols);
        continue;
      }
      for (int64_t i = 0; i < m; i += W::MR)
        tile_rows<W>(std::min(W::MR, m - i), xp + i * k, k, block, s, yp + i * n + b * NB, n,
                     cols);
    }
  });
  return y;
}

at::Tensor linear(const at::Tensor& x, const at::Tensor& blocks, int64_t n) {
  TORCH_CHECK(blocks.scalar_type() == at::kFloat, "servebench::linear: float32 blocks");
  return blocked_linear<F32>(x, blocks, nullptr, n);
}

// scales: [ceil(n / NB) * NB] float32, each output channel's scale times 256 (the upcast's
// factor), padded as the blocks are.
at::Tensor linear_fp8(const at::Tensor& x, const at::Tensor& blocks, const at::Tensor& scales,
                      int64_t n) {
  TORCH_CHECK(blocks.scalar_type() == at::kFloat8_e4m3fn && scales.scalar_type() == at::kFloat &&
                  scales.is_contiguous() && scales.numel() == blocks.size(0) * NB,
              "servebench::linear_fp8: e4m3 blocks and their float32 scales, padded to ", NB);
  return blocked_linear<Fp8>(x, blocks, scales.const_data_ptr<float>(), n);
}

// servebench::linear_rows: y = x W^T with W as it is, [n, k] row-major, for a few rows of x: a
// tied LM head shares the embedding's matrix, and where no blocked copy of it is kept (fp8
// models, to save the memory) MKL's product read SmolLM2's at ~16 GB/s at one row (7.8 ms; a
// sum, 3.8 ms). Each thread takes a range of W's rows, one at a time and in order (one
// sequential stream), four FMA chains over k, one horizontal sum per output: 4.2 ms at one
// row, 9.0 at eight where MKL took 13 (engine/model/llama.py uses it up to 8 rows).
at::Tensor linear_rows(const at::Tensor& x_in, const at::Tensor& w) {
  TORCH_CHECK(x_in.dim() == 2 && w.dim() == 2 && x_in.size(1) == w.size(1),
              "servebench::linear_rows: x [m, k] and w [n, k], got ", x_in.sizes(), " and ",
              w.sizes());
  TORCH_CHECK(x_in.scalar_type() == at::kFloat && w.scalar_type() == at::kFloat &&
                  w.is_contiguous(),
              "servebench::linear_rows: float32, w contiguous");
  const at::Tensor x = x_in.contiguous();
  const int64_t m = x.size(0), k = x.size(1), n = w.size(0);
  const int64_t kv = k - k % Vec::size();
  at::Tensor y = at::empty({m, n}, x.options());
  const float* xp = x.data_ptr<float>();
  const float* wp = w.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  const int64_t k4 = k - k % (4 * Vec::size());
  at::parallel_for(0, n, 64, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* wr = wp + r * k;
      for (int64_t i = 0; i < m; ++i) {
        const float* xi = xp + i * k;
        Vec acc[4] = {Vec(0.f), Vec(0.f), Vec(0.f), Vec(0.f)};
        int64_t j = 0;
        for (; j < k4; j += 4 * Vec::size())
          for (int64_t u = 0; u < 4; ++u)
            acc[u] = at::vec::fmadd(Vec::loadu(xi + j + u * Vec::size()),
                                    Vec::loadu(wr + j + u * Vec::size()), acc[u]);
        for (; j < kv; j += Vec::size())
          acc[0] = at::vec::fmadd(Vec::loadu(xi + j), Vec::loadu(wr + j), acc[0]);
        const Vec all = (acc[0] + acc[1]) + (acc[2] + acc[3]);
        float sum = at::vec::vec_reduce_all<float>([](Vec& a, Vec& b) { return a + b; }, all);
        for (; j < k; ++j) sum += xi[j] * wr[j];
        yp[i * n + r] = sum;
      }
    }
  });
  return y;
}

// servebench::decode_attention: one query token per sequence over its blocks of the paged cache
// (float32), what the compiled decode forward's layers call. Each (sequence, KV head) is one
// task: scores of its `group` query heads against each key (K read once, in place, through the
// block table), softmax, then the weighted sum of V (read once) per query head with the 64-wide
// output in registers. The compiled formula (ops/cpu_decode_attention.py) read the cache at
// 5-8 GB/s at 64 sequences (README, "Measured design choices"). servebench::decode_attention_fp8
// reads an e4m3 cache the same way, each K and V row upcast in registers as the linears' weights
// are (Fp8 above), the head's K scale folded into the scores' and its V scale into the output's.
template <int64_t D, typename W>
void attend(const float* q, const typename W::T* k, const typename W::T* v, const int64_t* table,
            const bool* mask, int64_t nb, int64_t bs, int64_t block_stride, int64_t group,
            float scale, float v_scale, float* scores, float* out) {
  constexpr int64_t DV = D / Vec::size();
  static_assert(D % NB == 0);
  const auto load_row = [](const typename W::T* p, Vec* r) {
    for (int64_t c = 0; c < D / NB; ++c) W::load(p + c * NB, r + c * NV);
  };
  const int64_t keys = nb * bs;
  for (int64_t g = 0; g < group; ++g) {
    Vec qv[DV];
    for (int64_t d = 0; d < DV; ++d) qv[d] = Vec::loadu(q + g * D + d * Vec::size());
    float* row = scores + g * keys;
    for (int64_t blk = 0; blk < nb; ++blk) {
      if (table[blk] < 0) {  // no key of this block is in the context (checked by the caller)
        std::fill(row + blk * bs, row + (blk + 1) * bs, -std::numeric_limits<float>::infinity());
        continue;
      }
      const typename W::T* kb = k + table[blk] * block_stride;
      for (int64_t t = 0; t < bs; ++t) {
        const int64_t j = blk * bs + t;
        if (!mask[j]) {
          row[j] = -std::numeric_limits<float>::infinity();
          continue;
        }
        Vec kr[DV];
        load_row(kb + t * D, kr);
        Vec acc = qv[0] * kr[0];
        for (int64_t d = 1; d < DV; ++d) acc = at::vec::fmadd(qv[d], kr[d], acc);
        row[j] = scale * at::vec::vec_reduce_all<float>([](Vec& a, Vec& b) { return a + b; }, acc);
      }
    }
    // Softmax's numerator in place (masked keys are -inf: exp gives 0), vectorized.
    const int64_t kv = keys - keys % Vec::size();
    Vec topv(-std::numeric_limits<float>::infinity());
    for (int64_t j = 0; j < kv; j += Vec::size()) topv = at::vec::maximum(topv, Vec::loadu(row + j));
    float top = at::vec::vec_reduce_all<float>([](Vec& a, Vec& b) { return at::vec::maximum(a, b); }, topv);
    for (int64_t j = kv; j < keys; ++j) top = std::max(top, row[j]);
    Vec sumv(0.f);
    for (int64_t j = 0; j < kv; j += Vec::size()) {
      const Vec e = (Vec::loadu(row + j) - Vec(top)).exp();
      e.store(row + j);
      sumv = sumv + e;
    }
    float total = at::vec::vec_reduce_all<float>([](Vec& a, Vec& b) { return a + b; }, sumv);
    for (int64_t j = kv; j < keys; ++j) {
      row[j] = std::exp(row[j] - top);
      total += row[j];
    }
    Vec o[DV];
    for (int64_t d = 0; d < DV; ++d) o[d] = Vec(0.f);
    for (int64_t blk = 0; blk < nb; ++blk) {
      if (table[blk] < 0) continue;
      const typename W::T* vb = v + table[blk] * block_stride;
      for (int64_t t = 0; t < bs; ++t) {
        const float w = row[blk * bs + t];
        if (w == 0.f) continue;
        const Vec wv(w);
        Vec vr[DV];
        load_row(vb + t * D, vr);
        for (int64_t d = 0; d < DV; ++d) o[d] = at::vec::fmadd(wv, vr[d], o[d]);
      }
    }
    const Vec inv(v_scale / total);
    for (int64_t d = 0; d < DV; ++d) (o[d] * inv).store(out + g * D + d * Vec::size());
  }
}

// k_scale, v_scale: one per KV head (nullptr: a float32 cache).
template <typename W>
at::Tensor paged_decode(const at::Tensor& q_in, const at::Tensor& k_cache,
                        const at::Tensor& v_cache, const at::Tensor& block_tables,
                        const at::Tensor& mask_in, double scale, const float* k_scale,
                        const float* v_scale) {
  // q [B, kv_heads, group, D]; caches [kv_heads, blocks, bs, D]; tables [B, nb]; mask [B, nb*bs]
  TORCH_CHECK(q_in.dim() == 4 && k_cache.dim() == 4 && v_cache.sizes() == k_cache.sizes() &&
                  block_tables.dim() == 2 && mask_in.dim() == 2,
              "servebench::decode_attention: unexpected ranks");
  const int64_t b = q_in.size(0), heads = q_in.size(1), group = q_in.size(2), d = q_in.size(3);
  const int64_t blocks = k_cache.size(1), bs = k_cache.size(2), nb = block_tables.size(1);
  TORCH_CHECK(k_cache.size(0) == heads && k_cache.size(3) == d && block_tables.size(0) == b &&
                  mask_in.size(0) == b && mask_in.size(1) == nb * bs,
              "servebench::decode_attention: shapes disagree");
  TORCH_CHECK(d == 64 || d == 128, "servebench::decode_attention: head_dim 64 or 128, got ", d);
  TORCH_CHECK(q_in.scalar_type() == at::kFloat && k_cache.is_contiguous() &&
                  v_cache.is_contiguous(),
              "servebench::decode_attention: float32 queries, contiguous caches");
  const at::Tensor q = q_in.contiguous();
  const at::Tensor tables = block_tables.to(at::kLong).contiguous();
  const at::Tensor mask = mask_in.to(at::kBool).contiguous();
  at::Tensor out = at::empty_like(q);
  const float* qp = q.data_ptr<float>();
  const auto* kp = static_cast<const typename W::T*>(k_cache.const_data_ptr());
  const auto* vp = static_cast<const typename W::T*>(v_cache.const_data_ptr());
  const int64_t* tp = tables.data_ptr<int64_t>();
  const bool* mp = mask.data_ptr<bool>();
  float* op = out.data_ptr<float>();
  const int64_t block_stride = bs * d, head_stride = blocks * bs * d;
  const auto fn = d == 64 ? attend<64, W> : attend<128, W>;
  // An e4m3 row holds 1/256 of its values (Fp8::load): the factor and the head's scales go
  // into the scores' scale and the output's.
  const float factor = std::is_same_v<W, F32> ? 1.f : 256.f;
  // The blocks each sequence reads: -1 where none of a block's keys is in its context (the
  // table's padding), checked in range where one is.
  std::vector<int64_t> used(b * nb);
  for (int64_t i = 0; i < b; ++i)
    for (int64_t t = 0; t < nb; ++t) {
      const bool* m = mp + i * nb * bs + t * bs;
      const bool read = std::any_of(m, m + bs, [](bool x) { return x; });
      const int64_t block = read ? tp[i * nb + t] : -1;
      TORCH_CHECK(block < blocks, "servebench::decode_attention: block ", block, " of ", blocks);
      TORCH_CHECK(block >= 0 || !read, "servebench::decode_attention: negative block in context");
      used[i * nb + t] = block;
    }
  at::parallel_for(0, b * heads, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores(group * nb * bs);
    for (int64_t task = begin; task < end; ++task) {
      const int64_t i = task / heads, h = task % heads;
      const int64_t qo = (i * heads + h) * group * d;
      const float ks = k_scale == nullptr ? 1.f : k_scale[h] * factor;
      const float vs = v_scale == nullptr ? 1.f : v_scale[h] * factor;
      fn(qp + qo, kp + h * head_stride, vp + h * head_stride, used.data() + i * nb,
         mp + i * nb * bs, nb, bs, block_stride, group, static_cast<float>(scale) * ks, vs,
         scores.data(), op + qo);
    }
  });
  return out;
}

at::Tensor decode_attention(const at::Tensor& q, const at::Tensor& k_cache,
                            const at::Tensor& v_cache, const at::Tensor& block_tables,
                            const at::Tensor& mask, double scale) {
  TORCH_CHECK(k_cache.scalar_type() == at::kFloat && v_cache.scalar_type() == at::kFloat,
              "servebench::decode_attention: float32 caches");
  return paged_decode<F32>(q, k_cache, v_cache, block_tables, mask, scale, nullptr, nullptr);
}

// k_scale, v_scale: float32, one per KV head (any shape of that many elements).
at::Tensor decode_attention_fp8(const at::Tensor& q, const at::Tensor& k_cache,
                                const at::Tensor& v_cache, const at::Tensor& block_tables,
                                const at::Tensor& mask, double scale, const at::Tensor& k_scale,
                                const at::Tensor& v_scale) {
  const int64_t heads = k_cache.size(0);
  TORCH_CHECK(k_cache.scalar_type() == at::kFloat8_e4m3fn &&
                  v_cache.scalar_type() == at::kFloat8_e4m3fn,
              "servebench::decode_attention_fp8: e4m3 caches");
  for (const at::Tensor* t : {&k_scale, &v_scale})
    TORCH_CHECK(t->scalar_type() == at::kFloat && t->is_contiguous() && t->numel() == heads,
                "servebench::decode_attention_fp8: one float32 scale per KV head");
  return paged_decode<Fp8>(q, k_cache, v_cache, block_tables, mask, scale,
                           k_scale.const_data_ptr<float>(), v_scale.const_data_ptr<float>());
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(servebench, m) {
  m.def("linear(Tensor x, Tensor blocks, int out_features) -> Tensor");
  m.def("linear_fp8(Tensor x, Tensor blocks, Tensor scales, int out_features) -> Tensor");
  m.def("linear_rows(Tensor x, Tensor w) -> Tensor");
  m.def("decode_attention_fp8(Tensor q, Tensor k_cache, Tensor v_cache, Tensor block_tables, "
        "Tensor mask, float scale, Tensor k_scale, Tensor v_scale) -> Tensor");
  m.def("decode_attention(Tensor q, Tensor k_cache, Tensor v_cache, Tensor block_tables, "
        "Tensor mask, float scale) -> Tensor");
}

TORCH_LIBRARY_IMPL(servebench, CPU, m) {
  m.impl("linear", linear);
  m.impl("linear_fp8", linear_fp8);
  m.impl("linear_rows", linear_rows);
  m.impl("decode_attention", decode_attention);
  m.impl("decode_attention_fp8", decode_attention_fp8);
}
