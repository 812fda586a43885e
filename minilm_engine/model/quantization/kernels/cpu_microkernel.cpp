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
//   fp32 / bf16 (`packed_mm`): W repacked once at load into tiles of 16 output rows, the one
//         copy: fp32 k-major (N / 16, K, 16), bf16 in pairs of inputs (N / 16, K / 2, 16, 2)
//         (oneDNN's own bf16 layout).  A tile is one contiguous run the prefetcher follows, and
//         one input (bf16: one pair, on `vdpbf16ps`) broadcast against it adds to 16 outputs:
//
//             x rows m0..m0+MB-1, input k ──┐
//                                            ├─ acc[m][0:16] += x[m, k] * W[16t:16t+16, k]
//             tile t, input k: 16 weights ──┘   (no sums across lanes at the end)
//
//         The plain (N, K) matrix read a block of rows as several short streams 2 KB apart that
//         collided in the caches' sets: one-row steps read it at about half the speed.

#include <torch/extension.h>
#include <ATen/Parallel.h>

#if defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>
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

// `f(std::integral_constant<int, mb>{})` for a runtime 1 <= mb <= sizeof...(I): the row count as a
// template argument, so its accumulators stay in registers
template <typename F, int... I>
inline void with_rows(int64_t mb, F&& f, std::integer_sequence<int, I...>) {
  (void)((mb == I + 1 ? (f(std::integral_constant<int, I + 1>{}), true) : false) || ...);
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

// ---------------------------------------------------------------- int8 / int4 on bf16 dot products
// Where the CPU has AVX512_BF16 (`vdpbf16ps`: 32 bf16 products summed in pairs into 16 fp32
// lanes per instruction) and x is bf16, the codes become bf16 in registers (exact: small
// integers) and the products run at twice the fp32 rate, so the kernel stays under the bf16
// matmul when the rows of x make it compute bound.  Lane n of a weight vector holds (w[n, k],
// w[n, k + 1]); x is read as 32-bit words holding (x[m, k], x[m, k + 1]) (`bf16_pairs`).
//   int8: q -> fp32 (exact) whose top half is its bf16; two k's joined in one vector.
//   int4: bf16 bits 0x4300 | u are exactly 128 + u for a nibble u, so the kernel sums
//         x (128 + u) and the group's correction takes 128 * sum(x) back out.
#if defined(__AVX512BF16__)
constexpr int MBH = 12;  // rows of x per block: MBH accumulators of 32 registers

#define MINILM_ROW_CASES(F) \
  switch (std::min<int64_t>(MBH, M - m0)) { \
    case 1: F(1); break; case 2: F(2); break; case 3: F(3); break; case 4: F(4); break; \
    case 5: F(5); break; case 6: F(6); break; case 7: F(7); break; case 8: F(8); break; \
    case 9: F(9); break; case 10: F(10); break; case 11: F(11); break; default: F(12); break; }

// (M, K) bf16 -> (M, ceil(K / 2)) words (x[m, 2j], x[m, 2j + 1]), an odd K's last one padded with 0
std::vector<uint32_t> bf16_pairs(const at::BFloat16* x, int64_t M, int64_t K) {
  const int64_t K2 = (K + 1) / 2;
  std::vector<uint32_t> out(M * K2, 0);
  for (int64_t m = 0; m < M; ++m) std::memcpy(out.data() + m * K2, x + m * K, K * sizeof(uint16_t));
  return out;
}

template <int mb, typename S>
void int8_block_bf16(const uint32_t* xp, int64_t K, const int8_t* tile, const S* scales, int64_t n0, int64_t N,
                     at::BFloat16* y) {
  const int64_t K2 = (K + 1) / 2;
  const __m512i high = _mm512_set1_epi32(static_cast<int>(0xFFFF0000u));
  // A row or two of x alone would wait on vdpbf16ps's latency, one sum after the other: give
  // each row C independent sums over alternating pairs of inputs, added at the end.
  constexpr int C = mb == 1 ? 4 : (mb == 2 ? 2 : 1);
  __m512 acc[C][mb];
  for (int c = 0; c < C; ++c)
    for (int m = 0; m < mb; ++m) acc[c][m] = _mm512_setzero_ps();
  auto pair = [&](int64_t j, int c) {  // inputs 2j and 2j + 1 into sum c
    const int8_t* p = tile + 2 * j * ROWS;
    const __m512i w0 = _mm512_castps_si512((__m512)int8_to_float(p));
    const __m512i w1 = 2 * j + 1 < K ? _mm512_castps_si512((__m512)int8_to_float(p + ROWS)) : _mm512_setzero_si512();
    // (w0 >> 16) | (w1 & 0xFFFF0000): w[k] in the low half, w[k + 1] in the high half
    const __m512bh w = (__m512bh)_mm512_ternarylogic_epi32(_mm512_srli_epi32(w0, 16), w1, high, 0xF8);
    for (int m = 0; m < mb; ++m)
      acc[c][m] = _mm512_dpbf16_ps(acc[c][m], (__m512bh)_mm512_set1_epi32(static_cast<int>(xp[m * K2 + j])), w);
  };
  int64_t j = 0;
  for (; j + C <= K2; j += C)
    for (int c = 0; c < C; ++c) pair(j + c, c);
  for (; j < K2; ++j) pair(j, 0);
  for (int c = 1; c < C; ++c)
    for (int m = 0; m < mb; ++m) acc[0][m] = _mm512_add_ps(acc[0][m], acc[c][m]);
  for (int m = 0; m < mb; ++m) {
    alignas(64) float lanes[ROWS];
    _mm512_store_ps(lanes, acc[0][m]);
    for (int i = 0; i < ROWS && n0 + i < N; ++i) y[m * N + n0 + i] = at::BFloat16(lanes[i] * as_float(scales[n0 + i]));
  }
}

template <typename S>
void int8_matmul_bf16(const at::BFloat16* x, int64_t M, int64_t K, const int8_t* codes, const S* scales, int64_t N,
                      at::BFloat16* y) {
  const auto xp = bf16_pairs(x, M, K);
  const int64_t K2 = (K + 1) / 2, tiles = (N + ROWS - 1) / ROWS;
  at::parallel_for(0, tiles, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t)
      for (int64_t m0 = 0; m0 < M; m0 += MBH) {
#define MINILM_INT8_BF16(n) int8_block_bf16<n>(xp.data() + m0 * K2, K, codes + t * K * ROWS, scales, t * ROWS, N, y + m0 * N)
        MINILM_ROW_CASES(MINILM_INT8_BF16)
#undef MINILM_INT8_BF16
      }
  });
}

// Bytes [d0, d0 + 16) of a torch tile: 16 rows from the low nibbles (n0 ..) and 16 from the
// high ones (n0 + half ..), each byte loaded and widened once for both.
template <int mb, typename S>
void int4_block_bf16(const uint32_t* xp, const float* xsum, int64_t K, int64_t G, int64_t group_size,
                     const uint8_t* tile, int64_t half, int64_t d0,
                     const S* scales_and_zeros, int64_t N_padded, int64_t n0, int64_t N, at::BFloat16* y) {
  const int64_t K2 = (K + 1) / 2;
  const __m512i mask = _mm512_set1_epi16(0x000F), bias = _mm512_set1_epi16(0x4300);
  float out[2][mb][ROWS] = {};
  for (int64_t g = 0; g < G; ++g) {
    __m512 lo_acc[mb], hi_acc[mb];
    for (int m = 0; m < mb; ++m) lo_acc[m] = hi_acc[m] = _mm512_setzero_ps();
    const int64_t j_end = std::min(K2, (g + 1) * group_size / 2);
    for (int64_t j = g * group_size / 2; j < j_end; ++j) {  // inputs 2j, 2j + 1 (within K_padded)
      const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(tile + 2 * j * half + d0));
      const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(tile + (2 * j + 1) * half + d0));
      // 16-bit lanes 2i, 2i + 1: row i's bytes at inputs 2j and 2j + 1
      const __m512i bytes = _mm512_cvtepu8_epi16(_mm256_set_m128i(_mm_unpackhi_epi8(a, b), _mm_unpacklo_epi8(a, b)));
      const __m512bh lo = (__m512bh)_mm512_ternarylogic_epi32(bytes, mask, bias, 0xEA);  // (u & 0xF) | 0x4300
      const __m512bh hi = (__m512bh)_mm512_ternarylogic_epi32(_mm512_srli_epi16(bytes, 4), mask, bias, 0xEA);
      for (int m = 0; m < mb; ++m) {
        const __m512bh xv = (__m512bh)_mm512_set1_epi32(static_cast<int>(xp[m * K2 + j]));
        lo_acc[m] = _mm512_dpbf16_ps(lo_acc[m], xv, lo);
        hi_acc[m] = _mm512_dpbf16_ps(hi_acc[m], xv, hi);
      }
    }
    for (int h = 0; h < 2; ++h)
      for (int m = 0; m < mb; ++m) {
        alignas(64) float sums[ROWS];
        _mm512_store_ps(sums, h ? hi_acc[m] : lo_acc[m]);
        for (int i = 0; i < ROWS; ++i) {
          const S* sz = scales_and_zeros + (g * N_padded + n0 + h * half + i) * 2;
          const float scale = as_float(sz[0]), offset = as_float(sz[1]) - 8.0f * scale;
          out[h][m][i] += scale * sums[i] + (offset - 128.0f * scale) * xsum[m * G + g];
        }
      }
  }
  for (int h = 0; h < 2; ++h)
    for (int m = 0; m < mb; ++m)
      for (int i = 0; i < ROWS && n0 + h * half + i < N; ++i) y[m * N + n0 + h * half + i] = at::BFloat16(out[h][m][i]);
}

// Bytes [d0, d0 + 32) of a torch tile (B = 64, AVX-512's packing): inputs 2j and 2j + 1 are one
// 64-byte run, read whole.  Interleaving their bytes pairs each row's two inputs; the in-lane
// unpack leaves rows 0-7 and 16-23 in one vector (`pl`) and 8-15, 24-31 in the other (`ph`), so
// four accumulators per row of x (low / high nibbles of each), four independent vdpbf16ps
// chains: one row of x is not held up by the instruction's latency.
constexpr int MB4 = 6;  // rows of x per block: 4 * MB4 accumulators + 4 weight vectors fit 32 registers

inline int64_t int4_lane_row(int v, int i) { return (i < 8 ? i : i + 8) + 8 * v; }  // v: pl 0, ph 1

// The scales of one unit (32 rows' low and high nibbles) laid out as its accumulators' lanes, per
// group: scale and correction (zero - 8 scale - 128 scale: the codes' offset and the 128 the
// bf16 bits add) for accumulator q, lane i.  Built once per unit and call, so a group's
// epilogue is two vector multiply-adds per accumulator, not 64 scalar ones.
template <typename S>
void int4_lane_scales(const S* scales_and_zeros, int64_t G, int64_t N_padded, int64_t n0, int64_t half,
                      float* scale, float* corr) {  // each (G, 4, 16)
  for (int64_t g = 0; g < G; ++g)
    for (int q = 0; q < 4; ++q)
      for (int i = 0; i < ROWS; ++i) {
        const S* sz = scales_and_zeros + (g * N_padded + n0 + (q / 2) * half + int4_lane_row(q % 2, i)) * 2;
        const float sc = as_float(sz[0]);
        scale[(g * 4 + q) * ROWS + i] = sc;
        corr[(g * 4 + q) * ROWS + i] = as_float(sz[1]) - 136.0f * sc;
      }
}

template <int mb>
void int4_block32_bf16(const uint32_t* xp, const float* xsum, int64_t K, int64_t G, int64_t group_size,
                       const uint8_t* tile, int64_t half, int64_t d0, const float* scale, const float* corr,
                       int64_t n0, int64_t N, at::BFloat16* y) {
  const int64_t K2 = (K + 1) / 2;
  const __m512i mask = _mm512_set1_epi16(0x000F), bias = _mm512_set1_epi16(0x4300);
  __m512 out[4][mb];  // [low pl, low ph, high pl, high ph][row of x]
  for (int q = 0; q < 4; ++q)
    for (int m = 0; m < mb; ++m) out[q][m] = _mm512_setzero_ps();
  for (int64_t g = 0; g < G; ++g) {
    __m512 acc[4][mb];
    for (int q = 0; q < 4; ++q)
      for (int m = 0; m < mb; ++m) acc[q][m] = _mm512_setzero_ps();
    const int64_t j_end = std::min(K2, (g + 1) * group_size / 2);
    for (int64_t j = g * group_size / 2; j < j_end; ++j) {
      const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(tile + 2 * j * half + d0));
      const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(tile + (2 * j + 1) * half + d0));
      const __m512i pl = _mm512_cvtepu8_epi16(_mm256_unpacklo_epi8(a, b));
      const __m512i ph = _mm512_cvtepu8_epi16(_mm256_unpackhi_epi8(a, b));
      const __m512bh w[4] = {(__m512bh)_mm512_ternarylogic_epi32(pl, mask, bias, 0xEA),  // (u & 0xF) | 0x4300
                             (__m512bh)_mm512_ternarylogic_epi32(ph, mask, bias, 0xEA),
                             (__m512bh)_mm512_ternarylogic_epi32(_mm512_srli_epi16(pl, 4), mask, bias, 0xEA),
                             (__m512bh)_mm512_ternarylogic_epi32(_mm512_srli_epi16(ph, 4), mask, bias, 0xEA)};
      for (int m = 0; m < mb; ++m) {
        const __m512bh xv = (__m512bh)_mm512_set1_epi32(static_cast<int>(xp[m * K2 + j]));
        for (int q = 0; q < 4; ++q) acc[q][m] = _mm512_dpbf16_ps(acc[q][m], xv, w[q]);
      }
    }
    for (int q = 0; q < 4; ++q) {
      const __m512 sc = _mm512_loadu_ps(scale + (g * 4 + q) * ROWS), co = _mm512_loadu_ps(corr + (g * 4 + q) * ROWS);
      for (int m = 0; m < mb; ++m)
        out[q][m] = _mm512_fmadd_ps(co, _mm512_set1_ps(xsum[m * G + g]), _mm512_fmadd_ps(sc, acc[q][m], out[q][m]));
    }
  }
  for (int q = 0; q < 4; ++q)
    for (int m = 0; m < mb; ++m) {
      alignas(64) float lanes[ROWS];
      _mm512_store_ps(lanes, out[q][m]);
      for (int i = 0; i < ROWS; ++i) {
        const int64_t n = n0 + (q / 2) * half + int4_lane_row(q % 2, i);
        if (n < N) y[m * N + n] = at::BFloat16(lanes[i]);
      }
    }
}

template <typename S>
void int4_matmul_bf16(const at::BFloat16* x, int64_t M, int64_t K, const uint8_t* packed, int64_t block_n,
                      const S* scales_and_zeros, int64_t G, int64_t group_size, int64_t N_padded, int64_t N,
                      at::BFloat16* y) {
  const auto xp = bf16_pairs(x, M, K);
  std::vector<float> xsum(M * G, 0.0f);  // (M, G)
  for (int64_t m = 0; m < M; ++m)
    for (int64_t k = 0; k < K; ++k) xsum[m * G + k / group_size] += as_float(x[m * K + k]);
  const int64_t half = block_n / 2, K_padded = G * group_size, K2 = (K + 1) / 2;
  if (half % 32 == 0) {  // AVX-512's packing: 32 bytes of an input at a time (int4_block32_bf16)
    const int64_t per_tile = half / 32, blocks = N_padded / block_n * per_tile;
    at::parallel_for(0, blocks, 1, [&](int64_t u0, int64_t u1) {
      std::vector<float> scale(G * 4 * ROWS), corr(G * 4 * ROWS);
      for (int64_t u = u0; u < u1; ++u) {
        const int64_t t = u / per_tile, d0 = (u % per_tile) * 32, n0 = t * block_n + d0;
        if (n0 >= N) continue;
        const uint8_t* tile = packed + t * K_padded * half;
        int4_lane_scales(scales_and_zeros, G, N_padded, n0, half, scale.data(), corr.data());
        for (int64_t m0 = 0; m0 < M; m0 += MB4)
          with_rows(std::min<int64_t>(MB4, M - m0), [&](auto mb) {
            int4_block32_bf16<decltype(mb)::value>(xp.data() + m0 * K2, xsum.data() + m0 * G, K, G, group_size, tile,
                                                   half, d0, scale.data(), corr.data(), n0, N, y + m0 * N);
          }, std::make_integer_sequence<int, MB4>{});
      }
    });
    return;
  }
  const int64_t per_tile = half / ROWS, blocks = N_padded / block_n * per_tile;
  at::parallel_for(0, blocks, 1, [&](int64_t u0, int64_t u1) {
    for (int64_t u = u0; u < u1; ++u) {
      const int64_t t = u / per_tile, d0 = (u % per_tile) * ROWS;
      const int64_t n0 = t * block_n + d0;  // the low nibbles' first row; the high ones' is n0 + half
      if (n0 >= N) continue;
      const uint8_t* tile = packed + t * K_padded * half;
      for (int64_t m0 = 0; m0 < M; m0 += MBH) {
#define MINILM_INT4_BF16(n) int4_block_bf16<n>(xp.data() + m0 * K2, xsum.data() + m0 * G, K, G, group_size, tile, \
                                               half, d0, scales_and_zeros, N_padded, n0, N, y + m0 * N)
        MINILM_ROW_CASES(MINILM_INT4_BF16)
#undef MINILM_INT4_BF16
      }
    }
  });
}
#undef MINILM_ROW_CASES
constexpr bool BF16_DOT = true;
#else
constexpr bool BF16_DOT = false;
#endif

// ---------------------------------------------------------------- vector helpers
// Plain GCC/Clang vector types: the compiler maps them to AVX2, AVX-512 or NEON registers.
typedef uint32_t vu32 __attribute__((vector_size(V * sizeof(uint32_t))));
#include "../../cpu_vector_math.h"  // exp_vector, lane_sum
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "bf16 pairs are read as little-endian words");

template <typename V_, typename P>
inline V_ load_vector(const P* p) {
  V_ v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

// ---------------------------------------------------------------- RMSNorm and rotary
// The fused path's small ops, one call each instead of ~8 torch ops: at decode each op costs its
// dispatch, not its arithmetic.  The arithmetic is decoder.RMSNorm's and rope.apply_rotary's,
// rounding to T where they do (the sum of squares is summed in another order: equal to rounding).

// Tokens of H rows of D (row h of token t at x + t * stride + h * D): each row times
// rsqrt(mean(row^2) + eps), rounded to T, times weight[h] (rounded to T), written to the same
// place in `out` (which may be x).
template <typename T>
void rms_norm_rows(T* x, int64_t stride, int64_t tokens, int64_t H, int64_t D, const T* weight, double eps,
                   T* out, int64_t out_stride) {
  at::parallel_for(0, tokens * H, 64, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t t = r / H, h = r % H;
      const T* xr = x + t * stride + h * D;
      T* yr = out + t * out_stride + h * D;
      const T* w = weight + h * D;
      float sum = 0.0f;
      for (int64_t i = 0; i < D; ++i) sum += as_float(xr[i]) * as_float(xr[i]);
      const float scale = 1.0f / std::sqrt(sum / D + static_cast<float>(eps));
      for (int64_t i = 0; i < D; ++i) yr[i] = T(as_float(w[i]) * as_float(T(as_float(xr[i]) * scale)));
    }
  });
}

// In place on rows of H heads of D: x * cos + rotate_half(x) * sin, each product rounded to T.
template <typename T>
void rotary_rows(T* x, int64_t stride, int64_t rows, int64_t H, int64_t D, const T* cos, const T* sin) {
  const int64_t half = D / 2;
  at::parallel_for(0, rows, 16, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const T* c = cos + r * D;
      const T* s = sin + r * D;
      for (int64_t h = 0; h < H; ++h) {
        T* xh = x + r * stride + h * D;
        for (int64_t i = 0; i < half; ++i) {
          const float a = as_float(xh[i]), b = as_float(xh[i + half]);
          const float lo_cos = as_float(T(a * as_float(c[i]))), lo_sin = as_float(T(-b * as_float(s[i])));
          const float hi_cos = as_float(T(b * as_float(c[i + half]))), hi_sin = as_float(T(a * as_float(s[i + half])));
          xh[i] = T(lo_cos + lo_sin);
          xh[i + half] = T(hi_cos + hi_sin);
        }
      }
    }
  });
}

// x (..., H, D) with its token dims one stride apart -> (number of tokens, the token stride)
std::pair<int64_t, int64_t> token_rows(const at::Tensor& x) {
  TORCH_CHECK(x.dim() >= 3 && x.stride(-1) == 1 && x.stride(-2) == x.size(-1), "x must be (..., H, D), heads dense");
  for (int64_t i = 0; i + 3 < x.dim(); ++i)
    TORCH_CHECK(x.stride(i) == x.size(i + 1) * x.stride(i + 1), "x's token dims must be one stride apart");
  return {x.numel() / (x.size(-1) * x.size(-2)), x.stride(-3)};
}



// -- bf16 weights packed in pairs (`packed_mm`) ------------------------------------------------
// packed (ceil(N / 16), ceil(K / 2), 16, 2): in tile t, pair p holds (w[16t + j, 2p], w[16t + j,
// 2p + 1]) for the tile's 16 rows j side by side (64 bytes), zeros past row N and input K.  A
// tile is one contiguous run the hardware prefetcher follows start to end, and one pair of
// inputs is an outer product: x's pair (x[m, 2p], x[m, 2p + 1]) broadcast against the 16 rows'
// pairs adds to 16 outputs at once, with no sum across lanes at the end.  (oneDNN packs bf16
// the same way.)  The plain (N, K) layout reads a block of rows as several short streams whose
// addresses collide in the caches' sets; one-row steps read it at ~25 GB/s where the tiles
// read at ~50 (2-core EPYC, 2026-12-04, benchmarks/roofline.py).
constexpr int PT = 16;    // output rows per tile
constexpr int PMC = 128;  // rows of x per chunk (see over_tiles)

// x's pair p of a row as one 32-bit word (x[2p] in the low half): a whole pair, or an odd K's
// last input with zero above it, as the packed weight's padding has
inline uint32_t x_pair(const at::BFloat16* row, int64_t p) {
  uint32_t word;
  std::memcpy(&word, row + 2 * p, 4);
  return word;
}

inline uint32_t x_last_half_pair(const at::BFloat16* row, int64_t K) {
  uint16_t half;
  std::memcpy(&half, row + K - 1, 2);
  return half;
}

// y[m, n0 + n] = acc[m][n] (+ bias), rounded once to y's type, for the n < N of the tile(s)
template <int mb, typename T>
inline void store_tile(const float (&acc)[mb][2 * PT], int width, const float* bias, int64_t n0, int64_t N, T* y) {
  const int nb = (int)std::min<int64_t>(width, N - n0);
  for (int m = 0; m < mb; ++m)
    for (int n = 0; n < nb; ++n) store(y + m * N + n0 + n, bias ? acc[m][n] + bias[n0 + n] : acc[m][n]);
}

// The loop both packed layouts share.  One row of x: tile by tile, `row(t)`.  More: rows of x in
// chunks of PMC that stay in L2 while every tile passes over them (a prefill reads the weight
// once per chunk: little beside its arithmetic), two tiles a block (each input of x shared by 32
// outputs; the last tile alone when their number is odd), MB rows at a time:
// `block(nv, mb, t, m0)` with nv and mb compile-time constants.
template <int MB, typename Row, typename Block>
void over_tiles(int64_t M, int64_t tiles, Row&& row, Block&& block) {
  if (M == 1) {
    at::parallel_for(0, tiles, 8, [&](int64_t t0, int64_t t1) {
      for (int64_t t = t0; t < t1; ++t) row(t);
    });
    return;
  }
  for (int64_t c0 = 0; c0 < M; c0 += PMC) {
    const int64_t c1 = std::min<int64_t>(M, c0 + PMC);
    at::parallel_for(0, (tiles + 1) / 2, 4, [&](int64_t b0, int64_t b1) {
      for (int64_t b = b0; b < b1; ++b) {
        const int64_t t = 2 * b;
        for (int64_t m0 = c0; m0 < c1; m0 += MB)  // the tiles stay in L1 / L2 for every block of x
          with_rows(std::min<int64_t>(MB, c1 - m0), [&](auto mb) {
            if (t + 1 < tiles) block(std::integral_constant<int, 2>{}, mb, t, m0);
            else block(std::integral_constant<int, 1>{}, mb, t, m0);
          }, std::make_integer_sequence<int, MB>{});
      }
    });
  }
}

#if defined(__AVX512BF16__)
// mb rows of x against nv adjacent tiles: mb * nv accumulators of 16 outputs each
template <int nv, int mb>
void packed_block_dot(const at::BFloat16* x, int64_t K, const at::BFloat16* tile, int64_t tile_size,
                      const float* bias, int64_t n0, int64_t N, at::BFloat16* y) {
  __m512 acc[mb][nv];
  for (int m = 0; m < mb; ++m)
    for (int v = 0; v < nv; ++v) acc[m][v] = _mm512_setzero_ps();
  const int64_t pairs = (K + 1) / 2;
  for (int64_t p = 0; p < pairs; ++p) {
    __m512bh w[nv];
    for (int v = 0; v < nv; ++v) w[v] = (__m512bh)_mm512_loadu_si512(tile + v * tile_size + p * 2 * PT);
    const bool half = 2 * p + 1 == K;  // true at most once, at the end
    for (int m = 0; m < mb; ++m) {
      const uint32_t word = half ? x_last_half_pair(x + m * K, K) : x_pair(x + m * K, p);
      const __m512bh xp = (__m512bh)_mm512_set1_epi32((int)word);
      for (int v = 0; v < nv; ++v) acc[m][v] = _mm512_dpbf16_ps(acc[m][v], xp, w[v]);
    }
  }
  float out[mb][2 * PT];
  for (int m = 0; m < mb; ++m)
    for (int v = 0; v < nv; ++v) _mm512_storeu_ps(out[m] + v * PT, acc[m][v]);
  store_tile<mb>(out, nv * PT, bias, n0, N, y);
}

// one row of x against one tile, the pairs dealt over U accumulators: one stream, and U
// independent chains of dot products to hide their latency
void packed_row_dot(const at::BFloat16* x, int64_t K, const at::BFloat16* tile, const float* bias, int64_t n0,
                    int64_t N, at::BFloat16* y) {
  constexpr int U = 4;
  __m512 acc[U];
  for (int u = 0; u < U; ++u) acc[u] = _mm512_setzero_ps();
  const int64_t pairs = K / 2, unrolled = pairs - pairs % U;
  for (int64_t p = 0; p < unrolled; p += U)
    for (int u = 0; u < U; ++u)
      acc[u] = _mm512_dpbf16_ps(acc[u], (__m512bh)_mm512_set1_epi32((int)x_pair(x, p + u)),
                                (__m512bh)_mm512_loadu_si512(tile + (p + u) * 2 * PT));
  for (int64_t p = unrolled; p < (K + 1) / 2; ++p) {
    const uint32_t word = 2 * p + 1 == K ? x_last_half_pair(x, K) : x_pair(x, p);
    acc[0] = _mm512_dpbf16_ps(acc[0], (__m512bh)_mm512_set1_epi32((int)word),
                              (__m512bh)_mm512_loadu_si512(tile + p * 2 * PT));
  }
  for (int u = 1; u < U; ++u) acc[0] = _mm512_add_ps(acc[0], acc[u]);
  float out[1][2 * PT];
  _mm512_storeu_ps(out[0], acc[0]);
  store_tile<1>(out, PT, bias, n0, N, y);
}

constexpr int PMB = 8;    // rows of x per block: 2 * PMB accumulators + 2 weights + 1 pair

void packed_matmul(const at::BFloat16* x, int64_t M, int64_t K, const at::BFloat16* packed, const float* bias,
                   int64_t N, at::BFloat16* y) {
  const int64_t tiles = (N + PT - 1) / PT, tile_size = (K + 1) / 2 * 2 * PT;
  over_tiles<PMB>(
      M, tiles, [&](int64_t t) { packed_row_dot(x, K, packed + t * tile_size, bias, t * PT, N, y); },
      [&](auto nv, auto mb, int64_t t, int64_t m0) {
        packed_block_dot<decltype(nv)::value, decltype(mb)::value>(x + m0 * K, K, packed + t * tile_size,
                                                                   tile_size, bias, t * PT, N, y + m0 * N);
      });
}
#else
// Without bf16 dot products: a pair word of the weight is two exact fp32 values (`word << 16`,
// `word & 0xFFFF0000`: a bf16 is the top half of an fp32), each multiplied by x's input broadcast
// in fp32.
constexpr int PV = PT / V;  // vectors per tile: 1 (AVX-512), 2 (AVX2, NEON)
constexpr int PMB = 4;      // rows of x per block: PMB * PV accumulators + 2 * PV + 2 vectors fit 16 registers

template <int mb>
void packed_block(const float* xf, int64_t K, const at::BFloat16* tile, const float* bias, int64_t n0, int64_t N,
                  at::BFloat16* y) {
  vfloat acc[mb][PV] = {};
  const int64_t pairs = (K + 1) / 2;
  const uint32_t* words = reinterpret_cast<const uint32_t*>(tile);
  for (int64_t p = 0; p < pairs; ++p) {
    vfloat even[PV], odd[PV];
    for (int h = 0; h < PV; ++h) {
      const vu32 w = load_vector<vu32>(words + p * PT + h * V);
      even[h] = (vfloat)(w << 16);
      odd[h] = (vfloat)(w & 0xFFFF0000u);
    }
    for (int m = 0; m < mb; ++m) {
      const float x0 = xf[m * K + 2 * p], x1 = 2 * p + 1 < K ? xf[m * K + 2 * p + 1] : 0.0f;
      for (int h = 0; h < PV; ++h) {  // two statements: two fused multiply-adds, no temporary
        acc[m][h] += x0 * even[h];
        acc[m][h] += x1 * odd[h];
      }
    }
  }
  float out[mb][2 * PT];
  for (int m = 0; m < mb; ++m)
    for (int h = 0; h < PV; ++h) std::memcpy(out[m] + h * V, &acc[m][h], sizeof(vfloat));
  store_tile<mb>(out, PT, bias, n0, N, y);
}

void packed_matmul(const at::BFloat16* x, int64_t M, int64_t K, const at::BFloat16* packed, const float* bias,
                   int64_t N, at::BFloat16* y) {
  const auto xf = to_float_rows(x, M, K);  // x converted once, not once per tile
  const int64_t tiles = (N + PT - 1) / PT, tile_size = (K + 1) / 2 * 2 * PT;
  at::parallel_for(0, tiles, 8, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t)
      for (int64_t m0 = 0; m0 < M; m0 += PMB) {
        const float* xb = xf.data() + m0 * K;
        at::BFloat16* yb = y + m0 * N;
        const at::BFloat16* tile = packed + t * tile_size;
        switch (std::min<int64_t>(PMB, M - m0)) {
          case 1: packed_block<1>(xb, K, tile, bias, t * PT, N, yb); break;
          case 2: packed_block<2>(xb, K, tile, bias, t * PT, N, yb); break;
          case 3: packed_block<3>(xb, K, tile, bias, t * PT, N, yb); break;
          default: packed_block<4>(xb, K, tile, bias, t * PT, N, yb); break;
        }
      }
  });
}
#endif

// -- fp32 weights packed k-major (`packed_mm` on float32) ---------------------------------------
// packed (ceil(N / 16), K, 16): in tile t, input k holds w[16t + j, k] for the tile's 16 rows j
// side by side (64 bytes), zeros past row N: the fp32 form of the pairs above.  One contiguous
// run per tile, and x[m, k] broadcast against it is one multiply-add into 16 outputs.
constexpr int FTV = PT / V;            // vectors per tile row: 1 (AVX-512), 2 (AVX2, NEON)
constexpr int FMB = V == 16 ? 8 : 2;   // rows of x per block against two tiles: FMB * 2 * FTV
                                       // accumulators + 2 * FTV weights fit the registers

template <int nv, int mb>
void kmajor_block(const float* x, int64_t K, const float* tile, int64_t tile_size, const float* bias, int64_t n0,
                  int64_t N, float* y) {
  vfloat acc[mb][nv * FTV] = {};
  for (int64_t k = 0; k < K; ++k) {
    vfloat w[nv * FTV];
    for (int v = 0; v < nv; ++v)
      for (int h = 0; h < FTV; ++h) w[v * FTV + h] = load_vector<vfloat>(tile + v * tile_size + k * PT + h * V);
    for (int m = 0; m < mb; ++m) {
      const float xv = x[m * K + k];
      for (int i = 0; i < nv * FTV; ++i) acc[m][i] += xv * w[i];
    }
  }
  float out[mb][2 * PT];
  for (int m = 0; m < mb; ++m)
    for (int i = 0; i < nv * FTV; ++i) std::memcpy(out[m] + i * V, &acc[m][i], sizeof(vfloat));
  store_tile<mb>(out, nv * PT, bias, n0, N, y);
}

// one row of x against one tile, the inputs dealt over U accumulators (see packed_row_dot)
void kmajor_row(const float* x, int64_t K, const float* tile, const float* bias, int64_t n0, int64_t N, float* y) {
  constexpr int U = 4;
  vfloat acc[U][FTV] = {};
  const int64_t unrolled = K - K % U;
  for (int64_t k = 0; k < unrolled; k += U)
    for (int u = 0; u < U; ++u)
      for (int h = 0; h < FTV; ++h) acc[u][h] += x[k + u] * load_vector<vfloat>(tile + (k + u) * PT + h * V);
  for (int64_t k = unrolled; k < K; ++k)
    for (int h = 0; h < FTV; ++h) acc[0][h] += x[k] * load_vector<vfloat>(tile + k * PT + h * V);
  float out[1][2 * PT];
  for (int h = 0; h < FTV; ++h) {
    for (int u = 1; u < U; ++u) acc[0][h] += acc[u][h];
    std::memcpy(out[0] + h * V, &acc[0][h], sizeof(vfloat));
  }
  store_tile<1>(out, PT, bias, n0, N, y);
}

void kmajor_matmul(const float* x, int64_t M, int64_t K, const float* packed, const float* bias, int64_t N,
                   float* y) {
  const int64_t tiles = (N + PT - 1) / PT, tile_size = K * PT;
  over_tiles<FMB>(
      M, tiles, [&](int64_t t) { kmajor_row(x, K, packed + t * tile_size, bias, t * PT, N, y); },
      [&](auto nv, auto mb, int64_t t, int64_t m0) {
        kmajor_block<decltype(nv)::value, decltype(mb)::value>(x + m0 * K, K, packed + t * tile_size, tile_size,
                                                               bias, t * PT, N, y + m0 * N);
      });
}

}  // namespace

// x (..., D) contiguous, weight (H, D) (H = 1: one norm) in x's dtype -> decoder.RMSNorm(x) with
// row r of x normalised by weight[r % H]
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  TORCH_CHECK(x.is_contiguous() && weight.is_contiguous() && x.scalar_type() == weight.scalar_type(),
              "x and weight must be contiguous, of one dtype");
  TORCH_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16, "x must be float32 or bfloat16");
  const int64_t D = x.size(-1), H = weight.numel() / D, rows = x.numel() / D;
  TORCH_CHECK(H * D == weight.numel() && rows % H == 0, "weight must be (H, D) with H dividing x's rows");
  at::Tensor y = at::empty_like(x);
  const int64_t tokens = rows / H, stride = H * D;
  if (x.scalar_type() == at::kFloat)
    rms_norm_rows(x.data_ptr<float>(), stride, tokens, H, D, weight.data_ptr<float>(), eps, y.data_ptr<float>(), stride);
  else
    rms_norm_rows(x.data_ptr<at::BFloat16>(), stride, tokens, H, D, weight.data_ptr<at::BFloat16>(), eps,
                  y.data_ptr<at::BFloat16>(), stride);
  return y;
}

// In place: x (..., H, D) (a view of the fused qkv output), each head normalised by weight[h]
// (H, D) when weight is given, then rotated by cos, sin (tokens, D) -> x
at::Tensor norm_rotary_(at::Tensor x, const c10::optional<at::Tensor>& weight, double eps, const at::Tensor& cos,
                        const at::Tensor& sin) {
  const auto [rows, stride] = token_rows(x);
  const int64_t H = x.size(-2), D = x.size(-1);
  const at::Tensor c = cos.contiguous(), s = sin.contiguous();
  TORCH_CHECK(c.numel() == rows * D && s.numel() == rows * D && c.scalar_type() == x.scalar_type() &&
              s.scalar_type() == x.scalar_type(), "cos and sin must be (tokens, D) in x's dtype");
  const bool norm = weight.has_value() && weight->defined();
  at::Tensor w = norm ? weight->contiguous() : at::Tensor();
  TORCH_CHECK(!norm || (w.numel() == H * D && w.scalar_type() == x.scalar_type()), "weight must be (H, D)");
  auto run = [&](auto* p, auto* cp, auto* sp, auto* wp) {
    if (wp) rms_norm_rows(p, stride, rows, H, D, wp, eps, p, stride);
    rotary_rows(p, stride, rows, H, D, cp, sp);
  };
  if (x.scalar_type() == at::kFloat)
    run(x.data_ptr<float>(), c.data_ptr<float>(), s.data_ptr<float>(), norm ? w.data_ptr<float>() : nullptr);
  else if (x.scalar_type() == at::kBFloat16)
    run(x.data_ptr<at::BFloat16>(), c.data_ptr<at::BFloat16>(), s.data_ptr<at::BFloat16>(),
        norm ? w.data_ptr<at::BFloat16>() : nullptr);
  else
    TORCH_CHECK(false, "x must be float32 or bfloat16");
  return x;
}

// x (..., 2 I) contiguous, gate then up -> silu(gate) * up (..., I), as decoder.MLP rounds it
// (silu rounded to T, then the product).  exp by exp_vector, V at a time: std::exp per element
// was ~35 us of a 3,072-wide row, more than the row's matmul share at one token.
at::Tensor silu_mul(const at::Tensor& x) {
  TORCH_CHECK(x.is_contiguous() && x.size(-1) % 2 == 0, "x must be contiguous (..., 2 I)");
  const int64_t I = x.size(-1) / 2, rows = x.numel() / (2 * I);
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
  shape.back() = I;
  at::Tensor y = at::empty(shape, x.options());
  auto run = [&](auto* xp, auto* yp) {
    using T = std::remove_pointer_t<decltype(yp)>;
    // one task per (row, span of 1,024 outputs): a decode row's 3,072 stay on one or two threads
    constexpr int64_t SPAN = 1024;
    const int64_t spans = (I + SPAN - 1) / SPAN;
    at::parallel_for(0, rows * spans, 1, [&](int64_t t0, int64_t t1) {
      for (int64_t t = t0; t < t1; ++t) {
        const int64_t r = t / spans, j0 = (t % spans) * SPAN, j1 = std::min(I, j0 + SPAN);
        const T* gate = xp + r * 2 * I;
        const T* up = gate + I;
        T* out = yp + r * I;
        for (int64_t j = j0; j < j1; j += V) {
          const int n = static_cast<int>(std::min<int64_t>(V, j1 - j));
          float g[V] = {}, u[V] = {}, silu[V];
          for (int i = 0; i < n; ++i) g[i] = as_float(gate[j + i]), u[i] = as_float(up[j + i]);
          const vfloat gv = load_vector<vfloat>(g);
          const vfloat sv = gv / (1.0f + exp_vector(-gv));
          std::memcpy(silu, &sv, sizeof(silu));
          for (int i = 0; i < n; ++i) out[j + i] = T(as_float(T(silu[i])) * u[i]);
        }
      }
    });
  };
  if (x.scalar_type() == at::kFloat) run(x.data_ptr<float>(), y.data_ptr<float>());
  else if (x.scalar_type() == at::kBFloat16) run(x.data_ptr<at::BFloat16>(), y.data_ptr<at::BFloat16>());
  else TORCH_CHECK(false, "x must be float32 or bfloat16");
  return y;
}

namespace {

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
#if defined(__AVX512BF16__)
  if (x.scalar_type() == at::kBFloat16) {
    auto* xb = x.data_ptr<at::BFloat16>();
    auto* yb = y.data_ptr<at::BFloat16>();
    if (scales.scalar_type() == at::kFloat) int8_matmul_bf16(xb, M, K, q, scales.data_ptr<float>(), N, yb);
    else int8_matmul_bf16(xb, M, K, q, scales.data_ptr<at::BFloat16>(), N, yb);
    return y;
  }
#endif
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
#if defined(__AVX512BF16__)
  if (x.scalar_type() == at::kBFloat16) {
    auto* xb = x.data_ptr<at::BFloat16>();
    auto* yb = y.data_ptr<at::BFloat16>();
    if (scales_and_zeros.scalar_type() == at::kFloat)
      int4_matmul_bf16(xb, M, K, p, block_n, scales_and_zeros.data_ptr<float>(), G, group_size, N_padded, N, yb);
    else
      int4_matmul_bf16(xb, M, K, p, block_n, scales_and_zeros.data_ptr<at::BFloat16>(), G, group_size, N_padded, N, yb);
    return y;
  }
#endif
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

// x (M, K) and a weight W (N, K) packed for the kernel, bias (N,) or None -> (M, N) = x @ W.T +
// bias in x's dtype, rounded once.  bf16: x bf16, packed (ceil(N / 16), ceil(K / 2), 16, 2) bf16
// (pairs); fp32: x float32, packed (ceil(N / 16), K, 16) float32 (k-major).
at::Tensor packed_mm(const at::Tensor& x, const at::Tensor& packed, int64_t N, const c10::optional<at::Tensor>& bias) {
  const bool bf16 = packed.scalar_type() == at::kBFloat16;
  TORCH_CHECK(bf16 || packed.scalar_type() == at::kFloat, "packed must be bfloat16 or float32");
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous() && x.scalar_type() == packed.scalar_type(),
              "x must be a contiguous (M, K) matrix in packed's dtype");
  const int64_t M = x.size(0), K = x.size(1), tiles = (N + PT - 1) / PT;
  if (bf16) {
    TORCH_CHECK(packed.is_contiguous() && packed.dim() == 4 && packed.size(0) == tiles &&
                packed.size(1) == (K + 1) / 2 && packed.size(2) == PT && packed.size(3) == 2,
                "packed must be (ceil(N / 16), ceil(K / 2), 16, 2) bf16 for x's K and N");
  } else {
    TORCH_CHECK(packed.is_contiguous() && packed.dim() == 3 && packed.size(0) == tiles && packed.size(1) == K &&
                packed.size(2) == PT, "packed must be (ceil(N / 16), K, 16) float32 for x's K and N");
  }
  at::Tensor bias_f;  // float32 (N,), or undefined
  if (bias.has_value() && bias->defined()) {
    TORCH_CHECK(bias->dim() == 1 && bias->size(0) == N, "bias must be (N,)");
    bias_f = bias->to(at::kFloat).contiguous();
  }
  const float* b = bias_f.defined() ? bias_f.data_ptr<float>() : nullptr;
  at::Tensor y = at::empty({M, N}, x.options());
  if (bf16)
    packed_matmul(x.data_ptr<at::BFloat16>(), M, K, packed.data_ptr<at::BFloat16>(), b, N, y.data_ptr<at::BFloat16>());
  else
    kmajor_matmul(x.data_ptr<float>(), M, K, packed.data_ptr<float>(), b, N, y.data_ptr<float>());
  return y;
}

// the vector width this build uses, in floats (8: AVX2 or narrower, 16: AVX-512)
int64_t vector_width() { return V; }

// whether int8_mm / int4_mm / packed_mm multiply bf16 x on bf16 dot products (AVX512_BF16)
bool bf16_dot() { return BF16_DOT; }
