// Decode-shaped matmuls (1 to ~64 rows of x) over fp32, bf16, int8 and int4 weights.
//
// Contract: y (M, N) = x (M, K) @ W.T with W the layer's (dequantized) weight, accumulated in
// fp32, for x and y in float32 or bfloat16 and scales in float32 or bfloat16.  Built at run
// time by cpu_compiled.py (torch.utils.cpp_extension, -O3 -march=native) for the machine it
// runs on; the tests hold it equal to the readable reference kernel.
//
// Why it exists: torch's weight-only operators convert each weight to float once per block of
// 4 rows of x, so their cost grows with every row of x; past ~4 rows they are compute-bound and
// lose to a bf16 matmul.  Here a weight is read from memory once per call and converted once
// per block of MB rows, and the weights of 16 output rows for one input k sit next to each
// other, so one k is an outer product: 16 weights (one or two vector registers) times MB
// broadcast inputs, accumulated into MB x 16 outputs held in registers.
//
//   int8: codes tiled as (N / 16, K, 16) int8: tile t holds rows 16t .. 16t+15, k-major
//         y[m, n] = scale[n] * sum_k x[m, k] * q[n, k]            (scale per output row)
//   int4: torch's CPU packing (N / B, K, B / 2) uint8, B = 32 or 64 (AVX2 / AVX-512): byte d of
//         input k holds rows d (low nibble) and d + B/2 (high nibble) of the tile
//         w = q * scale[g, n] + offset[g, n]  with (scale, zero) pairs of torch's (G, N, 2)
//         table, offset = zero - 8 * scale; per group g of inputs:
//         y[m, n] += scale[g, n] * sum_{k in g} x[m, k] q[n, k] + offset[g, n] * sum_{k in g} x[m, k]
//         so the scales touch each output once per group, not each weight.
//   fp32 / bf16 (`dense_mm`): W kept as the plain (N, K) matrix nn.Linear holds, the layout
//         torch's own matmul reads too (so prefill-sized steps run torch on the same one copy,
//         and a tied LM head stays the embedding table).  A block of DN output rows times DM
//         rows of x: per step of V inputs, DM x vectors and DN weight vectors (bf16 widened to
//         fp32 in registers, once for the whole block), DN x DM dot-product accumulators.  The
//         block's DN weight rows stay in L1/L2 while every block of rows of x passes over them,
//         so each weight comes from memory once per call.
//
//             x rows m0..m0+DM-1 ──┐   k ─────────────►
//                                   ├─ acc[m][n] += x[m, k:k+V] * W[n, k:k+V]   (V lanes)
//             W rows n0..n0+DN-1 ──┘   lanes summed once at the end of k

#include <torch/extension.h>
#include <ATen/Parallel.h>

#if defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

#include <algorithm>
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
constexpr int ROWS = 16;        // output rows per micro-tile
constexpr int NV = ROWS / V;    // vectors per micro-tile row
constexpr int MB = 6;           // rows of x per block: MB * NV accumulators + NV weights fit the registers

typedef float vfloat __attribute__((vector_size(V * sizeof(float))));

// V int8 codes (or V uint8 nibbles, shifted and masked) -> V floats.  Written with intrinsics
// where the ISA has a widening load: GCC 12 turns __builtin_convertvector on an 8-byte vector
// into scalar code (measured: 4x slower for the whole kernel).
inline vfloat int8_to_float(const int8_t* p) {
#if defined(__AVX512F__)
  return (vfloat)_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
#elif defined(__AVX2__)
  return (vfloat)_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
#else
  vfloat w;
  for (int i = 0; i < V; ++i) w[i] = p[i];
  return w;
#endif
}

inline vfloat nibbles_to_float(const uint8_t* p, int shift) {
#if defined(__AVX512F__)
  const __m512i b = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return (vfloat)_mm512_cvtepi32_ps(_mm512_and_si512(_mm512_srli_epi32(b, shift), _mm512_set1_epi32(0x0F)));
#elif defined(__AVX2__)
  const __m256i b = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
  return (vfloat)_mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srli_epi32(b, shift), _mm256_set1_epi32(0x0F)));
#else
  vfloat w;
  for (int i = 0; i < V; ++i) w[i] = (p[i] >> shift) & 0x0F;
  return w;
#endif
}

inline float as_float(float v) { return v; }
inline float as_float(at::BFloat16 v) { return static_cast<float>(v); }
inline void store(float* p, float v) { *p = v; }
inline void store(at::BFloat16* p, float v) { *p = at::BFloat16(v); }

template <typename T>
std::vector<float> to_float_rows(const T* x, int64_t M, int64_t K) {
  std::vector<float> xf(M * K);
  for (int64_t i = 0; i < M * K; ++i) xf[i] = as_float(x[i]);
  return xf;
}

// ---------------------------------------------------------------- int8
template <int mb, typename T, typename S>
void int8_block(const float* xf, int64_t K, const int8_t* tile, const S* scales, int64_t n0, int64_t N, T* y) {
  vfloat acc[mb][NV] = {};
  for (int64_t k = 0; k < K; ++k) {
    vfloat w[NV];
    for (int v = 0; v < NV; ++v) w[v] = int8_to_float(tile + k * ROWS + v * V);
    for (int m = 0; m < mb; ++m) {
      const float xv = xf[m * K + k];
      for (int v = 0; v < NV; ++v) acc[m][v] += xv * w[v];
    }
  }
  for (int m = 0; m < mb; ++m)
    for (int v = 0; v < NV; ++v)
      for (int i = 0; i < V; ++i) {
        const int64_t n = n0 + v * V + i;
        if (n < N) store(y + m * N + n, acc[m][v][i] * as_float(scales[n]));
      }
}

template <typename T, typename S>
void int8_matmul(const float* xf, int64_t M, int64_t K, const int8_t* codes, const S* scales, int64_t N, T* y) {
  const int64_t tiles = (N + ROWS - 1) / ROWS;
  at::parallel_for(0, tiles, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const int8_t* tile = codes + t * K * ROWS;
      for (int64_t m0 = 0; m0 < M; m0 += MB) {
        const float* xb = xf + m0 * K;
        T* yb = y + m0 * N;
        switch (std::min<int64_t>(MB, M - m0)) {
          case 1: int8_block<1>(xb, K, tile, scales, t * ROWS, N, yb); break;
          case 2: int8_block<2>(xb, K, tile, scales, t * ROWS, N, yb); break;
          case 3: int8_block<3>(xb, K, tile, scales, t * ROWS, N, yb); break;
          case 4: int8_block<4>(xb, K, tile, scales, t * ROWS, N, yb); break;
          case 5: int8_block<5>(xb, K, tile, scales, t * ROWS, N, yb); break;
          default: int8_block<6>(xb, K, tile, scales, t * ROWS, N, yb); break;
        }
      }
    }
  });
}

// ---------------------------------------------------------------- int4
// One micro-tile: 16 rows of a torch tile, bytes [d0, d0 + 16) of each input k, the low or the
// high nibble.  xsum (mb, G): each row of x summed over each group.
template <int mb, typename T, typename S>
void int4_block(const float* xf, const float* xsum, int64_t K, int64_t G, int64_t group_size,
                const uint8_t* tile, int64_t half, int64_t d0, int shift,
                const S* scales_and_zeros, int64_t N_padded, int64_t n0, int64_t N, T* y) {
  float out[mb][ROWS] = {};
  for (int64_t g = 0; g < G; ++g) {
    vfloat acc[mb][NV] = {};
    const int64_t k_end = std::min(K, (g + 1) * group_size);
    for (int64_t k = g * group_size; k < k_end; ++k) {
      vfloat w[NV];
      for (int v = 0; v < NV; ++v) w[v] = nibbles_to_float(tile + k * half + d0 + v * V, shift);
      for (int m = 0; m < mb; ++m) {
        const float xv = xf[m * K + k];
        for (int v = 0; v < NV; ++v) acc[m][v] += xv * w[v];
      }
    }
    // Copied out whole (vector stores) before the per-row scaling: reading lanes of acc one by
    // one makes the compiler keep acc in memory through the inner loop (measured 2x slower at 4 rows).
    float sums[mb][ROWS];
    std::memcpy(sums, acc, sizeof(sums));
    for (int i = 0; i < ROWS; ++i) {
      const S* sz = scales_and_zeros + (g * N_padded + n0 + i) * 2;
      const float scale = as_float(sz[0]), offset = as_float(sz[1]) - 8.0f * scale;
      for (int m = 0; m < mb; ++m) out[m][i] += scale * sums[m][i] + offset * xsum[m * G + g];
    }
  }
  for (int m = 0; m < mb; ++m)
    for (int i = 0; i < ROWS; ++i)
      if (n0 + i < N) store(y + m * N + n0 + i, out[m][i]);
}

template <typename T, typename S>
void int4_matmul(const float* xf, int64_t M, int64_t K, const uint8_t* packed, int64_t block_n,
                 const S* scales_and_zeros, int64_t G, int64_t group_size, int64_t N_padded, int64_t N, T* y) {
  std::vector<float> xsum(M * G, 0.0f);  // (M, G)
  for (int64_t m = 0; m < M; ++m)
    for (int64_t k = 0; k < K; ++k) xsum[m * G + k / group_size] += xf[m * K + k];
  const int64_t half = block_n / 2, K_padded = G * group_size;
  const int64_t micro_tiles = N_padded / ROWS, per_tile = block_n / ROWS;
  at::parallel_for(0, micro_tiles, 1, [&](int64_t u0, int64_t u1) {
    for (int64_t u = u0; u < u1; ++u) {
      const int64_t t = u / per_tile, j = u % per_tile;         // torch tile, micro-tile in it
      const int shift = (j * ROWS >= half) ? 4 : 0;             // high nibbles: rows B/2 .. B-1
      const int64_t d0 = (j * ROWS) % half;
      const int64_t n0 = t * block_n + (shift ? half : 0) + d0;  // first weight row of the micro-tile
      if (n0 >= N) continue;
      const uint8_t* tile = packed + t * K_padded * half;
      for (int64_t m0 = 0; m0 < M; m0 += MB) {
        const float* xb = xf + m0 * K;
        const float* sb = xsum.data() + m0 * G;
        T* yb = y + m0 * N;
#define MINILM_INT4_BLOCK(n) int4_block<n>(xb, sb, K, G, group_size, tile, half, d0, shift, scales_and_zeros, N_padded, n0, N, yb)
        switch (std::min<int64_t>(MB, M - m0)) {
          case 1: MINILM_INT4_BLOCK(1); break;
          case 2: MINILM_INT4_BLOCK(2); break;
          case 3: MINILM_INT4_BLOCK(3); break;
          case 4: MINILM_INT4_BLOCK(4); break;
          case 5: MINILM_INT4_BLOCK(5); break;
          default: MINILM_INT4_BLOCK(6); break;
        }
#undef MINILM_INT4_BLOCK
      }
    }
  });
}

// ---------------------------------------------------------------- fp32 / bf16
// Plain GCC/Clang vector types: the compiler maps them to AVX2, AVX-512 or NEON registers.
typedef uint32_t vu32 __attribute__((vector_size(V * sizeof(uint32_t))));
constexpr int DN = 4;  // output rows per block
constexpr int DM = 3;  // rows of x per block: DN * DM accumulators + DM + 1 vectors fit 16 registers
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "bf16 pairs are read as little-endian words");

template <typename V_, typename P>
inline V_ load_vector(const P* p) {
  V_ v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

// bf16 weights: 2V of them are read as V 32-bit words, each holding inputs 2i (low half) and
// 2i + 1 (high half).  A bf16 is the top half of an fp32, so `word << 16` is input 2i and
// `word & 0xFFFF0000` is input 2i + 1, exactly: two fp32 vectors from one load, no widening
// shuffle.  x is stored to match (`split_pairs`): per chunk of 2V inputs, the even ones, then
// the odd ones.
std::vector<float> split_pairs(const std::vector<float>& xf, int64_t M, int64_t K) {
  std::vector<float> out(xf);
  const int64_t k_vec = K - K % (2 * V);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t c = 0; c < k_vec; c += 2 * V)
      for (int i = 0; i < V; ++i) {
        out[m * K + c + i] = xf[m * K + c + 2 * i];
        out[m * K + c + V + i] = xf[m * K + c + 2 * i + 1];
      }
  return out;
}

// y[m, n] for m < mb, n < nb: one block of rows of x against one block of weight rows.
// bias: nb floats, added before the one rounding to T (as torch's fused bias does), or null.
// The block reads nb rows of K weights side by side: nb short streams (2 KB for a bf16 row of
// 1024) that the hardware prefetcher would learn anew for every block, so each step also asks
// for the same place in the next block's rows (a prefetch never faults, even past the end).
template <int nb, int mb, typename W, typename T>
void dense_block(const float* xf, int64_t K, const W* w, const float* bias, int64_t N, T* y) {
  constexpr bool bf16 = std::is_same<W, at::BFloat16>::value;
  constexpr int step = bf16 ? 2 * V : V;  // inputs per weight load
  vfloat acc[mb][nb] = {};
  const int64_t k_vec = K - K % step;
  for (int64_t k = 0; k < k_vec; k += step) {
    if constexpr (bf16) {
      vfloat x_even[mb], x_odd[mb];
      for (int m = 0; m < mb; ++m) {
        x_even[m] = load_vector<vfloat>(xf + m * K + k);
        x_odd[m] = load_vector<vfloat>(xf + m * K + k + V);
      }
      for (int n = 0; n < nb; ++n) {  // each weight read once, used for every row of the block
        __builtin_prefetch(w + (n + nb) * K + k);  // the next block's rows (see above)
        const vu32 words = load_vector<vu32>(w + n * K + k);
        const vfloat w_even = (vfloat)(words << 16), w_odd = (vfloat)(words & 0xFFFF0000u);
        for (int m = 0; m < mb; ++m) {  // two statements: two fused multiply-adds, no temporary
          acc[m][n] += x_even[m] * w_even;
          acc[m][n] += x_odd[m] * w_odd;
        }
      }
    } else {
      vfloat xv[mb];
      for (int m = 0; m < mb; ++m) xv[m] = load_vector<vfloat>(xf + m * K + k);
      for (int n = 0; n < nb; ++n) {
        __builtin_prefetch(w + (n + nb) * K + k);
        const vfloat wv = load_vector<vfloat>(w + n * K + k);
        for (int m = 0; m < mb; ++m) acc[m][n] += xv[m] * wv;
      }
    }
  }
  float lanes[mb][nb][V];  // copied out whole (see int4_block: lane reads would spill acc)
  std::memcpy(lanes, acc, sizeof(lanes));
  for (int m = 0; m < mb; ++m)
    for (int n = 0; n < nb; ++n) {
      float sum = 0.0f;
      for (int i = 0; i < V; ++i) sum += lanes[m][n][i];
      for (int64_t k = k_vec; k < K; ++k) sum += xf[m * K + k] * as_float(w[n * K + k]);
      store(y + m * N + n, bias ? sum + bias[n] : sum);
    }
}

template <int nb, typename W, typename T>
void dense_rows(const float* xf, int64_t M, int64_t K, const W* w, const float* bias, int64_t N, T* y) {
  for (int64_t m0 = 0; m0 < M; m0 += DM) {
    const float* xb = xf + m0 * K;
    T* yb = y + m0 * N;
    switch (std::min<int64_t>(DM, M - m0)) {
      case 1: dense_block<nb, 1>(xb, K, w, bias, N, yb); break;
      case 2: dense_block<nb, 2>(xb, K, w, bias, N, yb); break;
      default: dense_block<nb, 3>(xb, K, w, bias, N, yb); break;
    }
  }
}

template <typename W, typename T>
void dense_matmul(const float* xf, int64_t M, int64_t K, const W* w, const float* bias, int64_t N, T* y) {
  const int64_t blocks = (N + DN - 1) / DN;
  // Threads over output blocks: each reads its own slice of W, contiguous in memory.
  at::parallel_for(0, blocks, 16, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t n0 = b * DN;
      const W* wb = w + n0 * K;
      const float* bb = bias ? bias + n0 : nullptr;
      switch (std::min<int64_t>(DN, N - n0)) {
        case 1: dense_rows<1>(xf, M, K, wb, bb, N, y + n0); break;
        case 2: dense_rows<2>(xf, M, K, wb, bb, N, y + n0); break;
        case 3: dense_rows<3>(xf, M, K, wb, bb, N, y + n0); break;
        default: dense_rows<4>(xf, M, K, wb, bb, N, y + n0); break;
      }
    }
  });
}

void check_x(const at::Tensor& x) {
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous(), "x must be a contiguous (M, K) matrix");
  TORCH_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16, "x must be float32 or bfloat16");
}

}  // namespace

// x (M, K), codes (ceil(N / 16), K, 16) int8, scales (N,) -> (M, N) in x's dtype
at::Tensor int8_mm(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& scales) {
  check_x(x);
  const int64_t M = x.size(0), K = x.size(1), N = scales.size(0);
  TORCH_CHECK(codes.scalar_type() == at::kChar && codes.is_contiguous() && codes.dim() == 3 &&
              codes.size(0) * ROWS >= N && codes.size(1) == K && codes.size(2) == ROWS, "codes must be (ceil(N/16), K, 16) int8");
  TORCH_CHECK(scales.is_contiguous() && (scales.scalar_type() == at::kFloat || scales.scalar_type() == at::kBFloat16));
  at::Tensor y = at::empty({M, N}, x.options());
  const int8_t* q = codes.data_ptr<int8_t>();
  auto run = [&](auto* x_ptr, auto* y_ptr) {
    const auto xf = to_float_rows(x_ptr, M, K);
    if (scales.scalar_type() == at::kFloat) int8_matmul(xf.data(), M, K, q, scales.data_ptr<float>(), N, y_ptr);
    else int8_matmul(xf.data(), M, K, q, scales.data_ptr<at::BFloat16>(), N, y_ptr);
  };
  if (x.scalar_type() == at::kFloat) run(x.data_ptr<float>(), y.data_ptr<float>());
  else run(x.data_ptr<at::BFloat16>(), y.data_ptr<at::BFloat16>());
  return y;
}

// x (M, K) with K <= K_padded, packed (N_padded, K_padded / 2) uint8 in torch's CPU order with
// tiles of block_n rows, scales_and_zeros (G, N_padded, 2) -> (M, N) in x's dtype
at::Tensor int4_mm(const at::Tensor& x, const at::Tensor& packed, int64_t block_n,
                   const at::Tensor& scales_and_zeros, int64_t group_size, int64_t N) {
  check_x(x);
  const int64_t M = x.size(0), K = x.size(1);
  const int64_t G = scales_and_zeros.size(0), N_padded = scales_and_zeros.size(1);
  TORCH_CHECK(block_n % (2 * ROWS) == 0, "block_n must be a multiple of 32");
  TORCH_CHECK(packed.scalar_type() == at::kByte && packed.is_contiguous() && packed.size(0) == N_padded &&
              packed.size(1) * 2 == G * group_size && N_padded % block_n == 0 && K <= G * group_size && N <= N_padded,
              "packed must be (N_padded, G * group_size / 2) uint8 in whole tiles");
  TORCH_CHECK(scales_and_zeros.is_contiguous() && scales_and_zeros.size(2) == 2 &&
              (scales_and_zeros.scalar_type() == at::kFloat || scales_and_zeros.scalar_type() == at::kBFloat16));
  at::Tensor y = at::empty({M, N}, x.options());
  const uint8_t* p = packed.data_ptr<uint8_t>();
  auto run = [&](auto* x_ptr, auto* y_ptr) {
    const auto xf = to_float_rows(x_ptr, M, K);
    if (scales_and_zeros.scalar_type() == at::kFloat)
      int4_matmul(xf.data(), M, K, p, block_n, scales_and_zeros.data_ptr<float>(), G, group_size, N_padded, N, y_ptr);
    else
      int4_matmul(xf.data(), M, K, p, block_n, scales_and_zeros.data_ptr<at::BFloat16>(), G, group_size, N_padded, N, y_ptr);
  };
  if (x.scalar_type() == at::kFloat) run(x.data_ptr<float>(), y.data_ptr<float>());
  else run(x.data_ptr<at::BFloat16>(), y.data_ptr<at::BFloat16>());
  return y;
}

// x (M, K), weight (N, K) float32 or bfloat16, both contiguous, bias (N,) or None
// -> (M, N) = x @ weight.T + bias in x's dtype, rounded once
at::Tensor dense_mm(const at::Tensor& x, const at::Tensor& weight, const c10::optional<at::Tensor>& bias) {
  check_x(x);
  TORCH_CHECK(weight.dim() == 2 && weight.is_contiguous() && weight.size(1) == x.size(1),
              "weight must be a contiguous (N, K) matrix with x's K");
  TORCH_CHECK(weight.scalar_type() == at::kFloat || weight.scalar_type() == at::kBFloat16,
              "weight must be float32 or bfloat16");
  const int64_t M = x.size(0), K = x.size(1), N = weight.size(0);
  at::Tensor bias_f;  // float32 (N,), or undefined
  if (bias.has_value() && bias->defined()) {
    TORCH_CHECK(bias->dim() == 1 && bias->size(0) == N, "bias must be (N,)");
    bias_f = bias->to(at::kFloat).contiguous();
  }
  const float* b = bias_f.defined() ? bias_f.data_ptr<float>() : nullptr;
  at::Tensor y = at::empty({M, N}, x.options());
  auto run = [&](auto* x_ptr, auto* y_ptr) {
    const auto xf = to_float_rows(x_ptr, M, K);  // x converted once, not once per weight
    if (weight.scalar_type() == at::kFloat) dense_matmul(xf.data(), M, K, weight.data_ptr<float>(), b, N, y_ptr);
    else dense_matmul(split_pairs(xf, M, K).data(), M, K, weight.data_ptr<at::BFloat16>(), b, N, y_ptr);
  };
  if (x.scalar_type() == at::kFloat) run(x.data_ptr<float>(), y.data_ptr<float>());
  else run(x.data_ptr<at::BFloat16>(), y.data_ptr<at::BFloat16>());
  return y;
}

// the vector width this build uses, in floats (8: AVX2 or narrower, 16: AVX-512)
int64_t vector_width() { return V; }
