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
// bound by FMAs. Blocks are split over the kernels' threads (cpu_pool.h); each block
// is read from memory once and from cache for the next MR rows of x. Vectorized through ATen's
// vec types, so the same source builds for AVX2 or AVX-512 (cpu_kernels.py sets the macros).

#include "cpu_kernels.h"

namespace {

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

// Rows of x times float32 weights on AVX-512, where a block row is one vector: MR rows are then
// only 6 chains of dependent FMAs, too few to cover their latency on two FMA pipes (~67 % of
// peak, 0.72x oneDNN's time at 64-1024 rows; 8 rows took two passes). WIDE blocks x WIDE_MR
// rows are 24 chains, each row's x[k] broadcast once for the WIDE weight loads: oneDNN's time
// at 256-1024 rows, 1.1-1.4x faster at 8-64 (benchmarks/cpu_linear.py). AVX2's 16 registers
// hold no more than its 12 accumulators of MR rows x 2 vectors.
constexpr int64_t WIDE = NV == 1 ? 3 : 1;
constexpr int64_t WIDE_MR = 8;
constexpr int64_t WIDE_ROWS = 2;  // one row streams the same at 1 or 3 chains

template <int64_t M>
void wide_tile(const float* x, int64_t k, const float* block, float* y, int64_t ldy) {
  Vec acc[WIDE][M];
  for (int64_t b = 0; b < WIDE; ++b)
    for (int64_t i = 0; i < M; ++i) acc[b][i] = Vec(0.f);
  for (int64_t j = 0; j < k; ++j) {
    Vec w[WIDE];
    for (int64_t b = 0; b < WIDE; ++b) w[b] = Vec::loadu(block + b * k * NB + j * NB);
    for (int64_t i = 0; i < M; ++i) {
      const Vec xj(x[i * k + j]);
      for (int64_t b = 0; b < WIDE; ++b) acc[b][i] = at::vec::fmadd(xj, w[b], acc[b][i]);
    }
  }
  for (int64_t b = 0; b < WIDE; ++b)
    for (int64_t i = 0; i < M; ++i) acc[b][i].store(y + i * ldy + b * NB);
}

void wide_rows(int64_t rows, const float* x, int64_t k, const float* block, float* y,
               int64_t ldy) {
  switch (rows) {
    case 1: return wide_tile<1>(x, k, block, y, ldy);
    case 2: return wide_tile<2>(x, k, block, y, ldy);
    case 3: return wide_tile<3>(x, k, block, y, ldy);
    case 4: return wide_tile<4>(x, k, block, y, ldy);
    case 5: return wide_tile<5>(x, k, block, y, ldy);
    case 6: return wide_tile<6>(x, k, block, y, ldy);
    case 7: return wide_tile<7>(x, k, block, y, ldy);
    case 8: return wide_tile<8>(x, k, block, y, ldy);
  }
}

// Groups of WIDE blocks split over the threads: whole groups as wide tiles, the last (short,
// or holding the padded block) one block at a time.
void wide_linear(const float* x, int64_t m, int64_t k, const float* w, float* y, int64_t n,
                 int64_t nblocks) {
  parallel_for(0, (nblocks + WIDE - 1) / WIDE, 1, [&](int64_t begin, int64_t end) {
    for (int64_t g = begin; g < end; ++g) {
      const int64_t b0 = g * WIDE;
      if ((b0 + WIDE) * NB <= n) {
        for (int64_t i = 0; i < m; i += WIDE_MR)
          wide_rows(std::min(WIDE_MR, m - i), x + i * k, k, w + b0 * k * NB, y + i * n + b0 * NB,
                    n);
        continue;
      }
      for (int64_t b = b0; b < std::min(b0 + WIDE, nblocks); ++b)
        for (int64_t i = 0; i < m; i += F32::MR)
          tile_rows<F32>(std::min(F32::MR, m - i), x + i * k, k, w + b * k * NB, nullptr,
                         y + i * n + b * NB, n, std::min(NB, n - b * NB));
    }
  });
}

// x [m, k] times blocks [ceil(n / NB), k, NB]: blocks split over the threads, each block
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
  if constexpr (std::is_same_v<W, F32> && WIDE > 1) {
    if (m >= WIDE_ROWS) {
      wide_linear(xp, m, k, wp, yp, n, blocks.size(0));
      return y;
    }
  }
  // Past one pass of rows, a low-precision block is upcast once into a float32 one (in L1 or
  // L2) that the float32 tiles then read: upcast in registers for every pass of rows, the
  // FMAs waited on the conversions (64 rows: 1.5x float32's time; upcast once, 0.97x).
  const bool upcast_once = !std::is_same_v<W, F32> && m > W::MR;
  parallel_for(0, blocks.size(0), 4, [&](int64_t begin, int64_t end) {
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
  parallel_for(0, n, 64, [&](int64_t begin, int64_t end) {
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

// The kernels' thread pool: `threads` in all (1: ATen's threads instead), idle workers
// spinning `spin_us` before they sleep. Returns the threads it has.
int64_t set_pool_threads(int64_t threads, int64_t spin_us) {
#if defined(SERVEBENCH_POOL)
  servebench_pool::Pool::get().resize(static_cast<int>(threads), spin_us);
  return servebench_pool::Pool::get().threads();
#else
  return 1;
#endif
}

int64_t pool_threads() {
#if defined(SERVEBENCH_POOL)
  return servebench_pool::Pool::get().threads();
#else
  return 1;
#endif
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(servebench, m) {
  m.def("set_pool_threads(int threads, int spin_us) -> int", set_pool_threads);
  m.def("pool_threads() -> int", pool_threads);
  m.def("linear(Tensor x, Tensor blocks, int out_features) -> Tensor");
  m.def("linear_fp8(Tensor x, Tensor blocks, Tensor scales, int out_features) -> Tensor");
  m.def("linear_rows(Tensor x, Tensor w) -> Tensor");
}

TORCH_LIBRARY_IMPL(servebench, CPU, m) {
  m.impl("linear", linear);
  m.impl("linear_fp8", linear_fp8);
  m.impl("linear_rows", linear_rows);
}
