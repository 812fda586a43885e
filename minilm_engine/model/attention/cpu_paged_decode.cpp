// Decode attention straight from the paged KV cache: one query token per sequence, each key and
// value read once, where it lies in its block (no gather, no padded copy).
//
// Contract: out (S, H, D) = softmax(q k^T / sqrt(D)) v for each sequence s over its
// context_lens[s] cached tokens, the slot of token t being
//     block_tables[s, t / block_size] * block_size + t % block_size
// in caches of (num_blocks, block_size, H_kv, D), float32 or bfloat16 (q and the caches of one
// dtype), accumulated in float32, rounded once to q's dtype.  Grouped-query heads: query head h
// reads K/V head h / (H / H_kv).  Built at run time by attention/cpu_compiled.py; the tests hold
// it equal to the readable reference (attention/paged.py) to float rounding.
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
  float lanes[MAX_G][V];
  std::memcpy(lanes, acc, sizeof(lanes));
  for (int j = 0; j < g; ++j) {
    float sum = 0.0f;
    for (int i = 0; i < V; ++i) sum += lanes[j][i];
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

template <typename T>
void decode(const T* q, const T* k_cache, const T* v_cache, const int64_t* block_tables, int64_t W,
            const int64_t* context_lens, int64_t S, int64_t H, int64_t H_kv, int64_t D, int64_t block_size,
            float scale, T* out) {
  const int64_t G = H / H_kv;  // query heads per K/V head
  at::parallel_for(0, S * H_kv, 1, [&](int64_t t0, int64_t t1) {
    std::vector<float> qf, acc, scores;
    for (int64_t task = t0; task < t1; ++task) {
      const int64_t s = task / H_kv, g = task % H_kv, L = context_lens[s];
      const int64_t* table = block_tables + s * W;
      qf.assign(G * D, 0.0f);
      acc.assign(G * D, 0.0f);
      scores.resize(G * L);
      for (int64_t j = 0; j < G; ++j) to_split_order(q + (s * H + g * G + j) * D, D, qf.data() + j * D);
      // Token t of the sequence sits in block table[t / block_size], at offset t % block_size:
      // walked block by block, so no division per token.
      auto for_each_token = [&](const T* cache, auto&& fn) {
        for (int64_t t0 = 0, b = 0; t0 < L; t0 += block_size, ++b) {
          const T* base = cache + (table[b] * block_size * H_kv + g) * D;
          const int64_t n = std::min(block_size, L - t0);
          for (int64_t o = 0; o < n; ++o) fn(t0 + o, base + o * H_kv * D);
        }
      };
      std::vector<float> token_scores(G);
      for_each_token(k_cache, [&](int64_t t, const T* k) {  // pass 1: each key read once for the G queries
        for (int64_t j0 = 0; j0 < G; j0 += MAX_G) {
          const int g_pass = static_cast<int>(std::min<int64_t>(MAX_G, G - j0));
          dots(qf.data() + j0 * D, g_pass, k, D, token_scores.data() + j0);
        }
        for (int64_t j = 0; j < G; ++j) scores[j * L + t] = token_scores[j] * scale;
      });
      std::vector<float> inv_sum(G);
      for (int64_t j = 0; j < G; ++j) {  // softmax, in float32
        float* row_scores = scores.data() + j * L;
        float top = row_scores[0];
        for (int64_t t = 1; t < L; ++t) top = std::max(top, row_scores[t]);
        float sum = 0.0f;
        for (int64_t t = 0; t < L; ++t) sum += (row_scores[t] = std::exp(row_scores[t] - top));
        inv_sum[j] = 1.0f / sum;
      }
      for_each_token(v_cache, [&](int64_t t, const T* v) {  // pass 2: each value read once for the G queries
        for (int64_t j = 0; j < G; ++j) axpy(scores[j * L + t], v, D, acc.data() + j * D);
      });
      for (int64_t j = 0; j < G; ++j)
        from_split_order(acc.data() + j * D, D, inv_sum[j], out + (s * H + g * G + j) * D);
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
