// The engine's decode attention over the paged KV cache (float32 queries), built and
// registered with the linears by engine/ops/cpu_kernels.py; shared types in cpu_kernels.h.

#include "cpu_kernels.h"

namespace {

// Blocks are scattered over the pool, so the hardware prefetcher, which follows addresses,
// stalls at each block's first rows; row t of the next block is asked for while row t of this
// one is read. 64 sequences of ~160 tokens, 30 layers, bf16: 1.2-1.35x faster on blocks
// scattered over the pool (a long-running server), unchanged on blocks in order.
template <typename T>
const T* next_block(const T* cache, const int64_t* table, int64_t blk, int64_t nb,
                    int64_t block_stride) {
  return blk + 1 < nb && table[blk + 1] >= 0 ? cache + table[blk + 1] * block_stride : nullptr;
}

template <int64_t D, typename T>
void prefetch_row(const T* block, int64_t t) {
  if (block == nullptr) return;
  const char* row = reinterpret_cast<const char*>(block + t * D);
  for (int64_t byte = 0; byte < D * static_cast<int64_t>(sizeof(T)); byte += 64)
    __builtin_prefetch(row + byte);
}

// servebench::decode_attention: one query token per sequence over its blocks of the paged cache
// (float32, or bfloat16 widened in registers: Bf16 in cpu_kernels.h), what the compiled decode
// forward's layers call. Each (sequence, KV head) is one task: scores of its `group` query heads
// against each key (K read once, in place, through the block table), softmax, then the weighted
// sum of V (read once) per query head with the 64-wide output in registers. The compiled
// formula (ops/cpu_decode_attention.py) read the cache at 5-8 GB/s at 64 sequences
// (docs/results/2026-12-04-cpu-design-choices.md). servebench::decode_attention_fp8 reads an e4m3 cache the same
// way, each K and V row upcast in registers as the linears' weights are (Fp8 in
// cpu_kernels.h), the head's K scale folded into the scores' and its V scale into the output's.
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
      const typename W::T* next = next_block(k, table, blk, nb, block_stride);
      for (int64_t t = 0; t < bs; ++t) {
        const int64_t j = blk * bs + t;
        prefetch_row<D>(next, t);
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
      const typename W::T* next = next_block(v, table, blk, nb, block_stride);
      for (int64_t t = 0; t < bs; ++t) {
        prefetch_row<D>(next, t);
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
  const float factor = std::is_same_v<W, Fp8> ? 256.f : 1.f;
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
  parallel_for(0, b * heads, 1, [&](int64_t begin, int64_t end) {
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
  TORCH_CHECK(v_cache.scalar_type() == k_cache.scalar_type(),
              "servebench::decode_attention: K and V caches of one dtype");
  if (k_cache.scalar_type() == at::kBFloat16)  // each row widened in registers (Bf16)
    return paged_decode<Bf16>(q, k_cache, v_cache, block_tables, mask, scale, nullptr, nullptr);
  TORCH_CHECK(k_cache.scalar_type() == at::kFloat,
              "servebench::decode_attention: float32 or bfloat16 caches");
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
  m.def("decode_attention_fp8(Tensor q, Tensor k_cache, Tensor v_cache, Tensor block_tables, "
        "Tensor mask, float scale, Tensor k_scale, Tensor v_scale) -> Tensor");
  m.def("decode_attention(Tensor q, Tensor k_cache, Tensor v_cache, Tensor block_tables, "
        "Tensor mask, float scale) -> Tensor");
}

TORCH_LIBRARY_IMPL(servebench, CPU, m) {
  m.impl("decode_attention", decode_attention);
  m.impl("decode_attention_fp8", decode_attention_fp8);
}
