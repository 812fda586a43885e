// Decode attention straight from the paged KV cache: one query token per sequence, each key and
// value read once, where it lies in its block (no gather, no padded copy); and the step's keys
// and values written into their slots (`write_kv`, attention/paged.py's write_kv_reference
// without its indexing op's dispatch: ~15 us a layer here, for a copy of a few KiB).
//
// Contract: out (S, H, D) = softmax(q k^T / sqrt(D)) v for each sequence s over its
// context_lens[s] cached tokens, the slot of token t being
//     block_tables[s, t / block_size] * block_size + t % block_size
// in caches of (num_blocks, block_size, H_kv, D), float32 or bfloat16 (q and the caches of one
// dtype), accumulated in float32, rounded once to q's dtype.  Grouped-query heads: query head h
// reads K/V head h / (H / H_kv).  Built at run time by attention/cpu_compiled.py; the tests hold
// it equal to the readable reference (attention/paged.py) to float rounding.
//
// Each sequence's context is cut into parts of whole blocks (at most 512 tokens, enough parts
// to give every thread a few: one long sequence is split too, as flash-decoding splits it);
// a part reads its tokens front to back, every K/V head of a token side by side, and keeps its
// own softmax maximum and sum; the parts are then merged, each rescaled to the largest maximum.
//
// Why: the reference gathers every sequence's keys and values into a padded (S, H_kv, L, D)
// copy per layer (a read and a write of all of them) before reading them again for the
// matmuls, so a long-context decode step pays three passes over the cache for one.  Here one
// (sequence, K/V head) is one task: its G = H / H_kv queries meet each key once
// (G dot products per key read), then each value once.
//
//   pass 1: for t in 0..L-1: scores[j, t] = q_j . k_t * scale        (j < G, k_t read once)
//   softmax of each row of scores, in float32
//   pass 2: for t in 0..L-1: acc[j] += p[j, t] * v_t                  (v_t read once)

#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

namespace {

#if defined(__AVX512F__)
constexpr int V = 16;  // floats per vector register
#else
constexpr int V = 8;   // AVX2, and two NEON registers per vector on aarch64
#endif
typedef float vfloat __attribute__((vector_size(V * sizeof(float))));
typedef uint32_t vu32 __attribute__((vector_size(V * sizeof(uint32_t))));
#include "../cpu_vector_math.h"  // exp_vector, lane_sum
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "bf16 pairs are read as little-endian words");

template <typename V_, typename P>
inline V_ load_vector(const P* p) {
  V_ v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

inline float as_float(float v) { return v; }
inline float as_float(at::BFloat16 v) { return static_cast<float>(v); }

// bf16 vectors are read 2V at a time as V 32-bit words: `word << 16` is element 2i,
// `word & 0xFFFF0000` element 2i + 1 (a bf16 is the top half of a float), so one load gives two
// float vectors.  Queries and accumulators are kept in the same order ("split pairs": per chunk
// of 2V elements, the even ones then the odd ones), so nothing is shuffled in the loops.
template <typename T>
constexpr int chunk() { return std::is_same<T, at::BFloat16>::value ? 2 * V : V; }

template <typename T>
void to_split_order(const T* src, int64_t D, float* dst) {
  const int64_t d_vec = D - D % chunk<T>();
  for (int64_t c = 0; c < d_vec; c += chunk<T>()) {
    if constexpr (std::is_same<T, at::BFloat16>::value) {
      for (int i = 0; i < V; ++i) {
        dst[c + i] = as_float(src[c + 2 * i]);
        dst[c + V + i] = as_float(src[c + 2 * i + 1]);
      }
    } else {
      for (int i = 0; i < V; ++i) dst[c + i] = src[c + i];
    }
  }
  for (int64_t d = d_vec; d < D; ++d) dst[d] = as_float(src[d]);
}

template <typename T>
void from_split_order(const float* src, int64_t D, float scale, T* dst) {
  const int64_t d_vec = D - D % chunk<T>();
  for (int64_t c = 0; c < d_vec; c += chunk<T>()) {
    if constexpr (std::is_same<T, at::BFloat16>::value) {
      for (int i = 0; i < V; ++i) {
        dst[c + 2 * i] = at::BFloat16(src[c + i] * scale);
        dst[c + 2 * i + 1] = at::BFloat16(src[c + V + i] * scale);
      }
    } else {
      for (int i = 0; i < V; ++i) dst[c + i] = src[c + i] * scale;
    }
  }
  for (int64_t d = d_vec; d < D; ++d) dst[d] = static_cast<T>(src[d] * scale);
}

// scores[j] = q_j . k for the g queries j < g (split order, float; q_j at q + j * D) and one key
// k (D elements of T): the key is loaded and widened once for all of them.
constexpr int MAX_G = 8;  // queries per pass over a key (more run in several passes)

template <typename T>
inline void dots(const float* q, int g, const T* k, int64_t D, float* scores) {
  vfloat acc[MAX_G] = {};
  const int64_t d_vec = D - D % chunk<T>();
  for (int64_t c = 0; c < d_vec; c += chunk<T>()) {
    if constexpr (std::is_same<T, at::BFloat16>::value) {
      const vu32 words = load_vector<vu32>(k + c);
      const vfloat even = (vfloat)(words << 16), odd = (vfloat)(words & 0xFFFF0000u);
      for (int j = 0; j < g; ++j) {
        acc[j] += load_vector<vfloat>(q + j * D + c) * even;
        acc[j] += load_vector<vfloat>(q + j * D + c + V) * odd;
      }
    } else {
      const vfloat kv = load_vector<vfloat>(k + c);
      for (int j = 0; j < g; ++j) acc[j] += load_vector<vfloat>(q + j * D + c) * kv;
    }
  }
  for (int j = 0; j < g; ++j) {
    float sum = lane_sum<V>(acc[j]);
    for (int64_t d = d_vec; d < D; ++d) sum += q[j * D + d] * as_float(k[d]);
    scores[j] = sum;
  }
}

// acc (split order, float) += p * v (D elements of T)
template <typename T>
inline void axpy(float p, const T* v, int64_t D, float* acc) {
  const int64_t d_vec = D - D % chunk<T>();
  for (int64_t c = 0; c < d_vec; c += chunk<T>()) {
    if constexpr (std::is_same<T, at::BFloat16>::value) {
      const vu32 words = load_vector<vu32>(v + c);
      vfloat even = load_vector<vfloat>(acc + c), odd = load_vector<vfloat>(acc + c + V);
      even += p * (vfloat)(words << 16);
      odd += p * (vfloat)(words & 0xFFFF0000u);
      std::memcpy(acc + c, &even, sizeof(even));
      std::memcpy(acc + c + V, &odd, sizeof(odd));
    } else {
      vfloat a = load_vector<vfloat>(acc + c);
      a += p * load_vector<vfloat>(v + c);
      std::memcpy(acc + c, &a, sizeof(a));
    }
  }
  for (int64_t d = d_vec; d < D; ++d) acc[d] += p * as_float(v[d]);
}

// row[0..n) = exp(row - top), returns their sum
inline float exp_sum(float* row, int64_t n, float top) {
  vfloat sums = {};
  int64_t t = 0;
  for (; t + V <= n; t += V) {
    const vfloat e = exp_vector(load_vector<vfloat>(row + t) - top);
    std::memcpy(row + t, &e, sizeof(e));
    sums += e;
  }
  float lanes[V], sum = 0.0f;
  std::memcpy(lanes, &sums, sizeof(lanes));
  for (int i = 0; i < V; ++i) sum += lanes[i];
  for (; t < n; ++t) {
    float tail[V] = {};
    tail[0] = row[t] - top;
    const vfloat e = exp_vector(load_vector<vfloat>(tail));
    sum += (row[t] = e[0]);
  }
  return sum;
}

// One part of one sequence: its tokens [t_begin, t_end), every head.  Token t's K/V heads lie
// side by side (H_kv * D elements), so the part reads its blocks front to back, each byte once.
// Out: acc (H, D) the unnormalised sum of p * v (split order), top (H) the largest score and
// sum (H) the sum of exp(score - top), for the merge across parts.
template <typename T>
void attend_part(const float* qf, const T* k_cache, const T* v_cache, const int64_t* table, int64_t t_begin,
                 int64_t t_end, int64_t H, int64_t H_kv, int64_t D, int64_t block_size, float scale,
                 std::vector<float>& scores, float* acc, float* top, float* sum) {
  const int64_t G = H / H_kv, P = t_end - t_begin;
  scores.resize(H * P);
  auto for_each_token = [&](const T* cache, auto&& fn) {  // block by block: no division per token
    for (int64_t t = t_begin; t < t_end;) {
      const int64_t o0 = t % block_size, n = std::min(block_size - o0, t_end - t);
      const T* base = cache + table[t / block_size] * block_size * H_kv * D;
      for (int64_t o = 0; o < n; ++o) fn(t - t_begin + o, base + (o0 + o) * H_kv * D);
      t += n;
    }
  };
  float token_scores[MAX_G];
  for_each_token(k_cache, [&](int64_t i, const T* k) {  // pass 1: each key read once for its G queries
    for (int64_t g = 0; g < H_kv; ++g)
      for (int64_t j0 = 0; j0 < G; j0 += MAX_G) {
        const int g_pass = static_cast<int>(std::min<int64_t>(MAX_G, G - j0));
        dots(qf + (g * G + j0) * D, g_pass, k + g * D, D, token_scores);
        for (int j = 0; j < g_pass; ++j) scores[(g * G + j0 + j) * P + i] = token_scores[j] * scale;
      }
  });
  for (int64_t h = 0; h < H; ++h) {  // softmax numerators, in float32
    float* row = scores.data() + h * P;
    top[h] = *std::max_element(row, row + P);
    sum[h] = exp_sum(row, P, top[h]);
  }
  std::fill(acc, acc + H * D, 0.0f);
  for_each_token(v_cache, [&](int64_t i, const T* v) {  // pass 2: each value read once for its G queries
    for (int64_t h = 0; h < H; ++h) axpy(scores[h * P + i], v + (h / G) * D, D, acc + h * D);
  });
}

template <typename T>
void decode(const T* q, const T* k_cache, const T* v_cache, const int64_t* block_tables, int64_t W,
            const int64_t* context_lens, int64_t S, int64_t H, int64_t H_kv, int64_t D, int64_t block_size,
            float scale, T* out) {
  // Each sequence's context in parts of whole blocks, enough parts for every thread a few
  // times over (one sequence of a long context is split too: flash-decoding's split), at most
  // MAX_PART tokens (a part's scores stay in the core's cache).
  constexpr int64_t MAX_PART = 512, MIN_PART = 32;
  int64_t total = 0;
  for (int64_t s = 0; s < S; ++s) total += context_lens[s];
  const int64_t want = (total + 4 * at::get_num_threads() - 1) / (4 * at::get_num_threads());
  int64_t part = std::min(MAX_PART, std::max(MIN_PART, want));
  part = std::max(block_size, part / block_size * block_size);
  std::vector<int64_t> first_part(S + 1, 0);  // parts of sequence s: first_part[s] .. first_part[s + 1] - 1
  for (int64_t s = 0; s < S; ++s) first_part[s + 1] = first_part[s] + (context_lens[s] + part - 1) / part;
  const int64_t num_parts = first_part[S];
  std::vector<float> qf(S * H * D);  // the queries in split order, once
  at::parallel_for(0, S * H, 16, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) to_split_order(q + r * D, D, qf.data() + r * D);
  });
  std::vector<float> acc(num_parts * H * D), top(num_parts * H), sum(num_parts * H);
  at::parallel_for(0, num_parts, 1, [&](int64_t p0, int64_t p1) {
    std::vector<float> scores;
    for (int64_t p = p0; p < p1; ++p) {
      const int64_t s = std::upper_bound(first_part.begin(), first_part.end(), p) - first_part.begin() - 1;
      const int64_t t_begin = (p - first_part[s]) * part, t_end = std::min(context_lens[s], t_begin + part);
      attend_part(qf.data() + s * H * D, k_cache, v_cache, block_tables + s * W, t_begin, t_end, H, H_kv, D,
                  block_size, scale, scores, acc.data() + p * H * D, top.data() + p * H, sum.data() + p * H);
    }
  });
  // Merge each head's parts: rescale each to the largest score of all, then divide by the total.
  at::parallel_for(0, S * H, 16, [&](int64_t r0, int64_t r1) {
    std::vector<float> merged(D);
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t s = r / H, h = r % H, p0 = first_part[s], p1 = first_part[s + 1];
      if (p1 - p0 == 1) {  // one part: nothing to rescale
        from_split_order(acc.data() + (p0 * H + h) * D, D, 1.0f / sum[p0 * H + h], out + r * D);
        continue;
      }
      float best = top[p0 * H + h], total_sum = 0.0f;
      for (int64_t p = p0 + 1; p < p1; ++p) best = std::max(best, top[p * H + h]);
      std::fill(merged.begin(), merged.end(), 0.0f);
      for (int64_t p = p0; p < p1; ++p) {
        const float w = std::exp(top[p * H + h] - best);
        total_sum += w * sum[p * H + h];
        const float* a = acc.data() + (p * H + h) * D;
        for (int64_t d = 0; d < D; ++d) merged[d] += w * a[d];
      }
      from_split_order(merged.data(), D, 1.0f / total_sum, out + r * D);
    }
  });
}

}  // namespace

// q (S, H, D), k_cache / v_cache (num_blocks, block_size, H_kv, D), block_tables (S, W) int64,
// context_lens (S,) int64 -> (S, H, D) in q's dtype
at::Tensor paged_decode(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                        const at::Tensor& block_tables, const at::Tensor& context_lens) {
  TORCH_CHECK(q.dim() == 3 && q.is_contiguous(), "q must be a contiguous (S, H, D) tensor");
  TORCH_CHECK(k_cache.dim() == 4 && k_cache.is_contiguous() && v_cache.sizes() == k_cache.sizes() &&
              v_cache.is_contiguous(), "k_cache and v_cache must be contiguous (num_blocks, block_size, H_kv, D)");
  TORCH_CHECK(q.scalar_type() == k_cache.scalar_type() && q.scalar_type() == v_cache.scalar_type(),
              "q and the caches must have one dtype");
  TORCH_CHECK(q.scalar_type() == at::kFloat || q.scalar_type() == at::kBFloat16, "q must be float32 or bfloat16");
  const int64_t S = q.size(0), H = q.size(1), D = q.size(2), block_size = k_cache.size(1), H_kv = k_cache.size(2);
  TORCH_CHECK(k_cache.size(3) == D && H % H_kv == 0, "the caches' heads must divide q's, with q's head size");
  TORCH_CHECK(block_tables.scalar_type() == at::kLong && block_tables.dim() == 2 && block_tables.size(0) == S &&
              block_tables.is_contiguous(), "block_tables must be a contiguous (S, W) int64 tensor");
  TORCH_CHECK(context_lens.scalar_type() == at::kLong && context_lens.numel() == S && context_lens.is_contiguous(),
              "context_lens must be a contiguous (S,) int64 tensor");
  const int64_t W = block_tables.size(1), num_blocks = k_cache.size(0);
  const int64_t* tables = block_tables.data_ptr<int64_t>();
  const int64_t* lens = context_lens.data_ptr<int64_t>();
  for (int64_t s = 0; s < S; ++s) {  // checked once, so the loops never read outside the cache
    TORCH_CHECK(lens[s] >= 1 && lens[s] <= W * block_size, "context_lens must be in 1 .. W * block_size");
    for (int64_t b = 0; b < (lens[s] + block_size - 1) / block_size; ++b)
      TORCH_CHECK(tables[s * W + b] >= 0 && tables[s * W + b] < num_blocks, "block id outside the cache");
  }
  at::Tensor out = at::empty_like(q);
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  if (q.scalar_type() == at::kFloat)
    decode(q.data_ptr<float>(), k_cache.data_ptr<float>(), v_cache.data_ptr<float>(), tables, W, lens, S, H, H_kv,
           D, block_size, scale, out.data_ptr<float>());
  else
    decode(q.data_ptr<at::BFloat16>(), k_cache.data_ptr<at::BFloat16>(), v_cache.data_ptr<at::BFloat16>(), tables,
           W, lens, S, H, H_kv, D, block_size, scale, out.data_ptr<at::BFloat16>());
  return out;
}

// k, v (N, H_kv, D), heads dense (a view of the fused qkv output may have any token stride) ->
// token i's heads copied to slot slot_mapping[i] of caches of (num_blocks, block_size, H_kv, D)
void write_kv(at::Tensor k_cache, at::Tensor v_cache, const at::Tensor& k, const at::Tensor& v,
              const at::Tensor& slot_mapping) {
  TORCH_CHECK(k_cache.dim() == 4 && k_cache.is_contiguous() && v_cache.sizes() == k_cache.sizes() &&
              v_cache.is_contiguous(), "k_cache and v_cache must be contiguous (num_blocks, block_size, H_kv, D)");
  const int64_t H_kv = k_cache.size(2), D = k_cache.size(3), slots = k_cache.size(0) * k_cache.size(1);
  for (const at::Tensor* x : {&k, &v})
    TORCH_CHECK(x->dim() == 3 && x->size(1) == H_kv && x->size(2) == D && x->stride(2) == 1 && x->stride(1) == D &&
                x->scalar_type() == k_cache.scalar_type(), "k and v must be (N, H_kv, D), heads dense, in the cache's dtype");
  const int64_t N = k.size(0);
  TORCH_CHECK(v.size(0) == N && slot_mapping.scalar_type() == at::kLong && slot_mapping.numel() == N &&
              slot_mapping.is_contiguous(), "slot_mapping must be a contiguous (N,) int64 tensor");
  const int64_t* slot = slot_mapping.data_ptr<int64_t>();
  for (int64_t i = 0; i < N; ++i) TORCH_CHECK(slot[i] >= 0 && slot[i] < slots, "slot outside the cache");
  const int64_t row_bytes = H_kv * D * k.element_size();
  auto* kc = static_cast<char*>(k_cache.data_ptr());
  auto* vc = static_cast<char*>(v_cache.data_ptr());
  const auto* kp = static_cast<const char*>(k.data_ptr());
  const auto* vp = static_cast<const char*>(v.data_ptr());
  const int64_t k_stride = k.stride(0) * k.element_size(), v_stride = v.stride(0) * v.element_size();
  for (int64_t i = 0; i < N; ++i) {
    std::memcpy(kc + slot[i] * row_bytes, kp + i * k_stride, row_bytes);
    std::memcpy(vc + slot[i] * row_bytes, vp + i * v_stride, row_bytes);
  }
}
