// Vector math the CPU kernels share: exp over a vector of floats, the sum of a vector's lanes.
//
// Contract: include after defining `V` (floats per vector) and `vfloat` (a GCC/clang vector of V
// floats) and including <cstring>, <cstdint>; `cpu_build.read_source` pastes this file in place
// of its `#include` line (the kernels are built from one source string), so a change here
// rebuilds every kernel that includes it.
//
// Why one copy: the paged decode's softmax and the micro-kernel's SiLU both need exp, and
// `std::exp` is one scalar call per element (about 10 ns here) where these are a few vector
// instructions; -ffast-math, which would let the compiler vectorize `expf`, is not used.

// A vector's worth of exp: exp(x) = 2^n * e^r, n = round(x / ln 2), r = x - n ln 2 in
// [-ln2/2, ln2/2], e^r by its degree-6 Taylor polynomial (relative error below 2e-7, about
// one float rounding).  x is clamped to [-87.3, 88.7], where 2^n is a normal float: below,
// exp(x) < 1.2e-38 comes out as ~1.2e-38 (nothing beside a softmax's exp(0) = 1, or in
// SiLU's 1 + exp(-x)); above, the largest float's 3.3e38 instead of infinity (SiLU: ~0 either way).
// NaN stays NaN.
inline vfloat exp_vector(vfloat x) {
  const vfloat lo = vfloat{} - 87.3f, hi = vfloat{} + 88.7f;
  x = x < lo ? lo : x;
  x = x > hi ? hi : x;
  // round to nearest by the 1.5 * 2^23 trick (exact for |x / ln 2| < 2^22; no -ffast-math here)
  const vfloat n = (x * 1.44269504f + 12582912.0f) - 12582912.0f;
  const vfloat r = (x - n * 0.693145751953125f) - n * 1.428606765330187e-06f;  // ln 2 in two parts
  vfloat poly = r * (1.0f / 720) + 1.0f / 120;
  poly = poly * r + 1.0f / 24;
  poly = poly * r + 1.0f / 6;
  poly = poly * r + 0.5f;
  poly = poly * r + 1.0f;
  poly = poly * r + 1.0f;
  typedef int32_t vi32 __attribute__((vector_size(V * sizeof(int32_t))));
  const vi32 bits = (__builtin_convertvector(n, vi32) + 127) << 23;  // 2^n as a float's bits
  vfloat two_n;
  std::memcpy(&two_n, &bits, sizeof(two_n));
  return poly * two_n;
}

// The sum of a vector's N lanes, halving in registers (a loop over the lanes is N dependent adds).
template <int N>
inline float lane_sum(const void* v) {
  if constexpr (N <= 2) {
    float two[2];
    std::memcpy(two, v, sizeof(two));
    return two[0] + two[1];
  } else {
    typedef float vh __attribute__((vector_size(N / 2 * sizeof(float))));
    vh lo, hi;
    std::memcpy(&lo, v, sizeof(lo));
    std::memcpy(&hi, static_cast<const char*>(v) + sizeof(lo), sizeof(hi));
    const vh half = lo + hi;
    return lane_sum<N / 2>(&half);
  }
}
template <int N>
inline float lane_sum(const vfloat& v) { return lane_sum<N>(static_cast<const void*>(&v)); }
