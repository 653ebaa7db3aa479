// The engine's prefill attention over the paged KV cache: causal attention of each prefill
// chunk's queries to its request's cached keys and its own, read in place through the block
// table. Built and registered with the other kernels by engine/ops/cpu_kernels.py.
//
// Torch's path gathered every chunk's blocks into a contiguous K/V, padded the queries to the
// longest chunk and ran CPU SDPA on them: 4.7 ms a layer for 16 chunks of 128 tokens (SmolLM2's
// 9 query heads over 3 KV heads), ~60 GFLOP/s on a 2-core machine whose linears run at 420-950.
// Here a task is (chunk, KV head, 16 of its tokens) and everything is computed transposed, with
// the task's rows (token x query head of the group) along the vector lanes:
//   scores^T[key][row] = sum_d K[key][d] * Q^T[d][row]   (K broadcast, Q^T a few KB in L1)
//   softmax per row                                       (max, exp, sum: lane-wise over keys)
//   out[row][:] = sum_key P^T[key][row] * V[key][:]       (P broadcast, V rows as stored)
// so no product needs a horizontal sum and no K or V is copied or transposed.

#include "cpu_kernels.h"

namespace {

constexpr int64_t TQ = 16;  // tokens a task: rows = TQ * group, a whole number of vectors
constexpr int64_t L = Vec::size();

// One key's (or KC keys') scores against C vectors of rows: acc[k][c] += K[k][d] * Qt[d][c].
template <int64_t KC, int64_t C>
void score_keys(const float* qt, int64_t rows, int64_t d, const float* const* keys, float* s) {
  Vec acc[KC][C];
  for (int64_t k = 0; k < KC; ++k)
    for (int64_t c = 0; c < C; ++c) acc[k][c] = Vec(0.f);
  for (int64_t i = 0; i < d; ++i) {
    Vec qv[C];
    for (int64_t c = 0; c < C; ++c) qv[c] = Vec::loadu(qt + i * rows + c * L);
    for (int64_t k = 0; k < KC; ++k) {
      const Vec kv(keys[k][i]);
      for (int64_t c = 0; c < C; ++c) acc[k][c] = at::vec::fmadd(qv[c], kv, acc[k][c]);
    }
  }
  for (int64_t k = 0; k < KC; ++k)
    for (int64_t c = 0; c < C; ++c) acc[k][c].store(s + k * rows + c * L);
}

template <int64_t KC>
void score_rows(const float* qt, int64_t rows, int64_t d, const float* const* keys, float* s) {
  int64_t c = 0;  // three vectors of rows at a time: 3 * KC accumulators
  for (; c + 3 <= rows / L; c += 3) score_keys<KC, 3>(qt + c * L, rows, d, keys, s + c * L);
  if (rows / L - c == 2) score_keys<KC, 2>(qt + c * L, rows, d, keys, s + c * L);
  if (rows / L - c == 1) score_keys<KC, 1>(qt + c * L, rows, d, keys, s + c * L);
}

// out[r][:] = sum_j p[j][r] * V[j][:] / total[r] for RT rows, V rows widened in registers.
template <int64_t D, int64_t RT, typename W>
void weigh_values(const float* p, int64_t rows, int64_t keys,
                  const std::vector<const typename W::T*>& v_rows, const float* inv, int64_t n,
                  float* const* out) {
  constexpr int64_t DV = D / L;
  Vec o[RT][DV];
  for (int64_t r = 0; r < RT; ++r)
    for (int64_t x = 0; x < DV; ++x) o[r][x] = Vec(0.f);
  for (int64_t j = 0; j < keys; ++j) {
    Vec vr[DV];
    for (int64_t c = 0; c < D / NB; ++c) W::load(v_rows[j] + c * NB, vr + c * NV);
#pragma GCC unroll 8
    for (int64_t r = 0; r < RT; ++r) {
      const Vec w(p[j * rows + r]);
#pragma GCC unroll 8
      for (int64_t x = 0; x < DV; ++x) o[r][x] = at::vec::fmadd(w, vr[x], o[r][x]);
    }
  }
  // Unrolled over all RT rows (a loop to `n` would keep the accumulators in memory).
#pragma GCC unroll 8
  for (int64_t r = 0; r < RT; ++r)
    if (r < n)
      for (int64_t x = 0; x < DV; ++x) (o[r][x] * Vec(inv[r])).store(out[r] + x * L);
}

struct Task {
  int64_t request, head, first, tokens;  // tokens [first, first + tokens) of the chunk
};

template <int64_t D, typename W>
void attend_task(const Task& t, const float* q, int64_t heads, int64_t group, const int64_t* qs,
                 const int64_t* starts, const typename W::T* k, const typename W::T* v,
                 const int64_t* table, int64_t bs, int64_t block_stride, float scale,
                 std::vector<float>& buf, std::vector<const typename W::T*>& v_rows, float* out) {
  constexpr int64_t RT = std::max<int64_t>(1, 16 / (D / L));  // 16 accumulators: no spills
  const int64_t n = t.tokens * group, rows = (n + L - 1) / L * L;
  const int64_t start = starts[t.request], keys = start + t.first + t.tokens;
  buf.resize(rows * D + keys * rows + rows);
  float* qt = buf.data();           // [D][rows], scaled
  float* s = qt + rows * D;         // [keys][rows]: scores, then weights
  float* inv = s + keys * rows;     // [rows]: 1 / sum of weights
  const int64_t token0 = qs[t.request] + t.first;
  for (int64_t i = 0; i < rows; ++i) {
    const float* src = q + ((token0 + i / group) * heads + t.head * group + i % group) * D;
    for (int64_t x = 0; x < D; ++x) qt[x * rows + i] = i < n ? src[x] * scale : 0.f;
  }
  const auto key_row = [&](const typename W::T* cache, int64_t j) {
    return cache + table[j / bs] * block_stride + (j % bs) * D;
  };
  // Scores, four keys at a time (each widened to float32 once for all rows).
  alignas(64) float widened[4][D];
  const float* kp[4] = {widened[0], widened[1], widened[2], widened[3]};
  int64_t j = 0;
  for (; j < keys; j += 4) {
    const int64_t kc = std::min<int64_t>(4, keys - j);
    for (int64_t c = 0; c < kc; ++c) {
      Vec r[D / L];
      for (int64_t b = 0; b < D / NB; ++b) W::load(key_row(k, j + c) + b * NB, r + b * NV);
      for (int64_t x = 0; x < D / L; ++x) r[x].store(widened[c] + x * L);
    }
    float* sj = s + j * rows;
    if (kc == 4) score_rows<4>(qt, rows, D, kp, sj);
    else for (int64_t c = 0; c < kc; ++c) score_rows<1>(qt, rows, D, kp + c, sj + c * rows);
  }
  // Causal: row i (token first + i / group) sees keys up to start + its token.
  for (int64_t token = 0; token < t.tokens; ++token)
    for (int64_t jj = start + t.first + token + 1; jj < keys; ++jj)
      std::fill_n(s + jj * rows + token * group, group, -std::numeric_limits<float>::infinity());
  // Softmax along keys, lane-wise over rows.
  for (int64_t c = 0; c < rows; c += L) {
    Vec m(-std::numeric_limits<float>::infinity());
    for (int64_t jj = 0; jj < keys; ++jj) m = at::vec::maximum(m, Vec::loadu(s + jj * rows + c));
    Vec sum(0.f);
    for (int64_t jj = 0; jj < keys; ++jj) {
      const Vec e = (Vec::loadu(s + jj * rows + c) - m).exp();
      e.store(s + jj * rows + c);
      sum = sum + e;
    }
    (Vec(1.f) / sum).store(inv + c);
  }
  v_rows.resize(keys);
  for (int64_t jj = 0; jj < keys; ++jj) v_rows[jj] = key_row(v, jj);
  float* dst[RT];
  for (int64_t r0 = 0; r0 < n; r0 += RT) {
    const int64_t m = std::min(RT, n - r0);
    for (int64_t r = 0; r < m; ++r) {
      const int64_t i = r0 + r;
      dst[r] = out + ((token0 + i / group) * heads + t.head * group + i % group) * D;
    }
    weigh_values<D, RT, W>(s + r0, rows, keys, v_rows, inv + r0, m, dst);
  }
}

// q [T, heads, D]; caches [kv_heads, blocks, bs, D]; block_tables [B, nb]; seq_lens [B];
// query_start [B + 1] (each chunk's first token in q, from 0): every request is a prefill
// chunk whose tokens are the last q_len of its seq_len (written to the cache already).
at::Tensor prefill_attention(const at::Tensor& q_in, const at::Tensor& k_cache,
                             const at::Tensor& v_cache, const at::Tensor& block_tables,
                             const at::Tensor& seq_lens, const at::Tensor& query_start,
                             double scale) {
  TORCH_CHECK(q_in.dim() == 3 && k_cache.dim() == 4 && v_cache.sizes() == k_cache.sizes() &&
                  block_tables.dim() == 2 && seq_lens.dim() == 1 && query_start.dim() == 1,
              "servebench::prefill_attention: unexpected ranks");
  const int64_t tokens = q_in.size(0), heads = q_in.size(1), d = q_in.size(2);
  const int64_t kv_heads = k_cache.size(0), blocks = k_cache.size(1), bs = k_cache.size(2);
  const int64_t b = block_tables.size(0), nb = block_tables.size(1);
  TORCH_CHECK(k_cache.size(3) == d && heads % kv_heads == 0 && seq_lens.size(0) == b &&
                  query_start.size(0) == b + 1,
              "servebench::prefill_attention: shapes disagree");
  TORCH_CHECK(d == 64 || d == 128, "servebench::prefill_attention: head_dim 64 or 128, got ", d);
  TORCH_CHECK(k_cache.scalar_type() == v_cache.scalar_type() &&
                  (k_cache.scalar_type() == at::kFloat || k_cache.scalar_type() == at::kBFloat16) &&
                  k_cache.is_contiguous() && v_cache.is_contiguous(),
              "servebench::prefill_attention: contiguous float32 or bfloat16 caches");
  const at::Tensor q = q_in.to(at::kFloat).contiguous();
  const at::Tensor tables = block_tables.to(at::kLong).contiguous();
  const at::Tensor lens = seq_lens.to(at::kLong).contiguous();
  const at::Tensor qs_t = query_start.to(at::kLong).contiguous();
  const int64_t* tp = tables.data_ptr<int64_t>();
  const int64_t* lp = lens.data_ptr<int64_t>();
  const int64_t* qs = qs_t.data_ptr<int64_t>();
  TORCH_CHECK(qs[0] == 0 && qs[b] == tokens, "servebench::prefill_attention: query_start ",
              "must run from 0 to the ", tokens, " query tokens");
  std::vector<int64_t> starts(b);
  std::vector<Task> tasks;
  for (int64_t i = 0; i < b; ++i) {
    const int64_t q_len = qs[i + 1] - qs[i];
    starts[i] = lp[i] - q_len;
    TORCH_CHECK(q_len >= 0 && starts[i] >= 0 && lp[i] <= nb * bs,
                "servebench::prefill_attention: request ", i, " has ", q_len, " queries and ",
                lp[i], " keys in ", nb, " blocks");
    for (int64_t t = 0; t < (lp[i] + bs - 1) / bs; ++t)
      TORCH_CHECK(tp[i * nb + t] >= 0 && tp[i * nb + t] < blocks,
                  "servebench::prefill_attention: block ", tp[i * nb + t], " of ", blocks);
    for (int64_t h = 0; h < kv_heads; ++h)
      for (int64_t f = 0; f < q_len; f += TQ) tasks.push_back({i, h, f, std::min(TQ, q_len - f)});
  }
  at::Tensor out = at::empty({tokens, heads, d}, q.options());
  const float* qp = q.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const int64_t group = heads / kv_heads, block_stride = bs * d, head_stride = blocks * bs * d;
  const auto run = [&](auto w, auto dim) {
    using W = decltype(w);
    constexpr int64_t D = decltype(dim)::value;
    const auto* kp = static_cast<const typename W::T*>(k_cache.const_data_ptr());
    const auto* vp = static_cast<const typename W::T*>(v_cache.const_data_ptr());
    parallel_for(0, static_cast<int64_t>(tasks.size()), 1, [&](int64_t begin, int64_t end) {
      std::vector<float> buf;  // a thread's scratch, grown to its largest task
      std::vector<const typename W::T*> v_rows;
      for (int64_t x = begin; x < end; ++x) {
        const Task& t = tasks[x];
        attend_task<D, W>(t, qp, heads, group, qs, starts.data(), kp + t.head * head_stride,
                          vp + t.head * head_stride, tp + t.request * nb, bs, block_stride,
                          static_cast<float>(scale), buf, v_rows, op);
      }
    });
  };
  const bool bf16 = k_cache.scalar_type() == at::kBFloat16;
  using D64 = std::integral_constant<int64_t, 64>;
  using D128 = std::integral_constant<int64_t, 128>;
  if (bf16 && d == 64) run(Bf16{}, D64{});
  else if (bf16) run(Bf16{}, D128{});
  else if (d == 64) run(F32{}, D64{});
  else run(F32{}, D128{});
  return out.to(q_in.scalar_type());
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(servebench, m) {
  m.def("prefill_attention(Tensor q, Tensor k_cache, Tensor v_cache, Tensor block_tables, "
        "Tensor seq_lens, Tensor query_start, float scale) -> Tensor");
}

TORCH_LIBRARY_IMPL(servebench, CPU, m) { m.impl("prefill_attention", prefill_attention); }
