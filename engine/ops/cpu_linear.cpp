// servebench::linear: y = x W^T on CPU in float32, for every row count, with the weight
// re-laid out once at load (engine/ops/cpu_linear.py).
//
// The weight is held in blocks of NB output rows, [ceil(n / NB), k, NB] (the last block
// zero-padded): for each k a block's NB weights are adjacent, so MR rows of x times one block is
// MR * NB / Vec::size() vector FMAs per k, x[k] broadcast, no horizontal sums, and each weight
// load serves MR rows. At one row that streams the weights at memory speed; at many rows it is
// bound by FMAs. Blocks are split over torch's threads (at::parallel_for, OpenMP); each block
// is read from memory once and from cache for the next MR rows of x. Vectorized through ATen's
// vec types, so the same source builds for AVX2 or AVX-512 (cpu_linear.py sets the macros).

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/cpu/vec/vec.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <algorithm>

namespace {

using Vec = at::vec::Vectorized<float>;
constexpr int64_t NB = 16;  // weight rows per block
constexpr int64_t MR = 6;   // rows of x per pass: MR * NB / 8 = 12 accumulators on AVX2
constexpr int64_t NV = NB / Vec::size();

// Rows [0, M) of x times one block: y[i, 0:cols] for each row i.
template <int64_t M>
void tile(const float* x, int64_t k, const float* block, float* y, int64_t ldy, int64_t cols) {
  Vec acc[M][NV];
  for (int64_t i = 0; i < M; ++i)
    for (int64_t v = 0; v < NV; ++v) acc[i][v] = Vec(0.f);
  for (int64_t j = 0; j < k; ++j) {
    Vec w[NV];
    for (int64_t v = 0; v < NV; ++v) w[v] = Vec::loadu(block + j * NB + v * Vec::size());
    for (int64_t i = 0; i < M; ++i) {
      const Vec xj(x[i * k + j]);
      for (int64_t v = 0; v < NV; ++v) acc[i][v] = at::vec::fmadd(xj, w[v], acc[i][v]);
    }
  }
  for (int64_t i = 0; i < M; ++i) {
    if (cols == NB) {
      for (int64_t v = 0; v < NV; ++v) acc[i][v].store(y + i * ldy + v * Vec::size());
    } else {  // the padded last block
      float out[NB];
      for (int64_t v = 0; v < NV; ++v) acc[i][v].store(out + v * Vec::size());
      std::copy(out, out + cols, y + i * ldy);
    }
  }
}

using Tile = void (*)(const float*, int64_t, const float*, float*, int64_t, int64_t);
constexpr Tile TILES[MR + 1] = {nullptr, tile<1>, tile<2>, tile<3>, tile<4>, tile<5>, tile<6>};

at::Tensor linear(const at::Tensor& x_in, const at::Tensor& blocks, int64_t n) {
  TORCH_CHECK(x_in.dim() == 2 && blocks.dim() == 3 && blocks.size(2) == NB &&
                  x_in.size(1) == blocks.size(1) && blocks.size(0) == (n + NB - 1) / NB,
              "servebench::linear: x [m, k] and blocks [ceil(n / ", NB, "), k, ", NB, "], got ",
              x_in.sizes(), ", ", blocks.sizes(), " and n = ", n);
  TORCH_CHECK(x_in.scalar_type() == at::kFloat && blocks.scalar_type() == at::kFloat &&
                  blocks.is_contiguous(),
              "servebench::linear: float32 and contiguous blocks only");
  const at::Tensor x = x_in.contiguous();
  const int64_t m = x.size(0), k = x.size(1);
  at::Tensor y = at::empty({m, n}, x.options());
  const float* xp = x.data_ptr<float>();
  const float* wp = blocks.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  at::parallel_for(0, blocks.size(0), 4, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      const int64_t cols = std::min(NB, n - b * NB);
      for (int64_t i = 0; i < m; i += MR) {
        TILES[std::min(MR, m - i)](xp + i * k, k, wp + b * k * NB, yp + i * n + b * NB, n, cols);
      }
    }
  });
  return y;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(servebench, m) {
  m.def("linear(Tensor x, Tensor blocks, int out_features) -> Tensor");
}

TORCH_LIBRARY_IMPL(servebench, CPU, m) { m.impl("linear", linear); }
