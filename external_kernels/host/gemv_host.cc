// y = W x for the emulator's decode GEMVs, reading the bf16 weights as stored (kernel_builder/gemv/host.py).
//
// A decode token streams every weight once; the f32 copies numpy's BLAS needs are twice the bytes. This reads
// the bf16 bits (an f32 with the low 16 bits zero) and accumulates in f32 in a fixed order per row:
//   partial[t] = fma(w[j], x[j], partial[t]) for j = t, t + 32, t + 64, ... (32 partials, from +0),
//   y = the 32 partials added in a fixed tree.
// The AVX2+FMA path (four 8-lane accumulators) and the scalar path perform the same operations in the same
// order and give identical bits (a NaN result is the one canonical quiet NaN).
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#if defined(__AVX2__) && defined(__FMA__) && !defined(LLAMA_NPU_SCALAR_ONLY)
#include <immintrin.h>
#define LLAMA_NPU_AVX2 1
#endif

namespace {

constexpr int kParts = 32;

inline float widen(uint16_t b) {
  const uint32_t bits = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

inline float tree(float* p, int n) {   // pairwise, in place: ((p0+p1)+(p2+p3))+... for n a power of two
  for (int w = n / 2; w >= 1; w /= 2)
    for (int t = 0; t < w; ++t) p[t] = p[2 * t] + p[2 * t + 1];
  return p[0];
}

}  // namespace

extern "C" {

// Rows [r0, r1) of y[m] = w[m, k] (bf16 bits) . x[k] (f32). Returns 0, or -2 for bad shapes.
int llama_npu_gemv_bf16(const uint16_t* w, const float* x, float* y, int m, int k, int r0, int r1) {
  if (m <= 0 || k <= 0 || r0 < 0 || r1 > m || r0 >= r1) return -2;
  const int full = k / kParts * kParts;
  for (int r = r0; r < r1; ++r) {
    const uint16_t* wr = w + static_cast<size_t>(r) * k;
    float part[kParts];
#ifdef LLAMA_NPU_AVX2
    __m256 a[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    for (int j = 0; j < full; j += kParts) {
#pragma GCC unroll 4
      for (int c = 0; c < 4; ++c) {
        const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(wr + j + 8 * c));
        const __m256 wv = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
        a[c] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x + j + 8 * c), a[c]);
      }
    }
    for (int c = 0; c < 4; ++c) _mm256_storeu_ps(part + 8 * c, a[c]);
#else
    for (int t = 0; t < kParts; ++t) part[t] = 0.0f;
    for (int j = 0; j < full; ++j) part[j % kParts] = std::fma(widen(wr[j]), x[j], part[j % kParts]);
#endif
    for (int j = full; j < k; ++j) part[j % kParts] = std::fma(widen(wr[j]), x[j], part[j % kParts]);
    const float v = tree(part, kParts);
    y[r] = v == v ? v : std::numeric_limits<float>::quiet_NaN();   // which NaN an add keeps is the compiler's

  }
  return 0;
}

}  // extern "C"
