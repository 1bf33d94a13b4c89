// y = dequant(W) x for the emulator's 4-bit decode GEMVs (kernel_builder/gemv_q4/reference.py), reading the q4
// rows as stored (docs/quantization.md): a quarter of the bf16 weight bytes per token.
//
// Each weight is dequantized exactly as the AIE2P kernel does (w = bf16_rne(d * q + m) in f32, or bf16_rne(d * q)
// for signed codes) and then accumulated in the order of gemv_host.cc (32 partial sums, fma, a fixed tree), so
// the result equals the bf16 host GEMV on the dequantized weights bit for bit. The AVX2+FMA path and the scalar
// path perform the same operations in the same order.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#if defined(__AVX2__) && defined(__FMA__) && !defined(LLAMA_NPU_SCALAR_ONLY)
#include <immintrin.h>
#define LLAMA_NPU_Q4_AVX2 1
#endif

namespace {

constexpr int kParts = 32;

inline float bits_f32(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

inline float bf16_at(const uint8_t* p) {
  uint16_t b;
  std::memcpy(&b, p, 2);
  return bits_f32(static_cast<uint32_t>(b) << 16);
}

inline float round_bf16(float f) {   // RNE to bf16, kept as f32 (finite inputs: weights)
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return bits_f32(u & 0xffff0000u);
}

inline float tree(float* p, int n) {
  for (int w = n / 2; w >= 1; w /= 2)
    for (int t = 0; t < w; ++t) p[t] = p[2 * t] + p[2 * t + 1];
  return p[0];
}

template <int BITS>
inline int code(const uint8_t* q, int j, int mins) {
  if (BITS == 8) return mins ? q[j] : static_cast<int8_t>(q[j]);
  const int nib = (q[j / 2] >> (4 * (j % 2))) & 0xF;
  return mins ? nib : (nib >= 8 ? nib - 16 : nib);
}

#ifdef LLAMA_NPU_Q4_AVX2
// 8 codes starting at element j (j % 8 == 0) as f32 lanes
template <int BITS>
inline __m256 codes8(const uint8_t* q, int j, int mins) {
  if (BITS == 8) {
    const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(q + j));
    return _mm256_cvtepi32_ps(mins ? _mm256_cvtepu8_epi32(b) : _mm256_cvtepi8_epi32(b));
  }
  uint32_t packed;
  std::memcpy(&packed, q + j / 2, 4);
  const __m256i sh = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28);
  __m256i v = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(static_cast<int>(packed)), sh),
                               _mm256_set1_epi32(0xF));
  if (!mins) v = _mm256_sub_epi32(_mm256_xor_si256(v, _mm256_set1_epi32(8)), _mm256_set1_epi32(8));
  return _mm256_cvtepi32_ps(v);
}

inline __m256 round_bf16_8(__m256 f) {
  const __m256i u = _mm256_castps_si256(f);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  const __m256i r = _mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), lsb));
  return _mm256_castsi256_ps(_mm256_and_si256(r, _mm256_set1_epi32(static_cast<int>(0xffff0000u))));
}
#endif

// Rows [r0, r1) of y[m] = dequant(w[m, rb bytes]) . x[k] (f32), BITS-bit codes. 0, or -2 for bad shapes.
template <int BITS>
int gemv_rows(const uint8_t* w, const float* x, float* y, int m, int k, int group, int mins, int rb, int r0,
              int r1) {
  if (m <= 0 || k <= 0 || group <= 0 || k % group || group % kParts || r0 < 0 || r1 > m || r0 >= r1) return -2;
  const int groups = k / group;
  for (int r = r0; r < r1; ++r) {
    const uint8_t* row = w + static_cast<size_t>(r) * rb;
    const uint8_t* sc = row + k * BITS / 8;
    const uint8_t* mn = sc + 2 * groups;
    float part[kParts];
#ifdef LLAMA_NPU_Q4_AVX2
    __m256 a[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    for (int g = 0; g < groups; ++g) {
      const __m256 d = _mm256_set1_ps(bf16_at(sc + 2 * g));
      const __m256 z = _mm256_set1_ps(mins ? bf16_at(mn + 2 * g) : 0.0f);
      for (int j = g * group; j < (g + 1) * group; j += kParts) {
#pragma GCC unroll 4
        for (int c = 0; c < 4; ++c) {
          __m256 wv = _mm256_mul_ps(d, codes8<BITS>(row, j + 8 * c, mins));
          if (mins) wv = _mm256_add_ps(wv, z);
          a[c] = _mm256_fmadd_ps(round_bf16_8(wv), _mm256_loadu_ps(x + j + 8 * c), a[c]);
        }
      }
    }
    for (int c = 0; c < 4; ++c) _mm256_storeu_ps(part + 8 * c, a[c]);
#else
    for (int t = 0; t < kParts; ++t) part[t] = 0.0f;
    for (int j = 0; j < k; ++j) {
      const int g = j / group;
      float wv = bf16_at(sc + 2 * g) * static_cast<float>(code<BITS>(row, j, mins));
      if (mins) wv = wv + bf16_at(mn + 2 * g);
      part[j % kParts] = std::fma(round_bf16(wv), x[j], part[j % kParts]);
    }
#endif
    const float v = tree(part, kParts);
    y[r] = v == v ? v : std::numeric_limits<float>::quiet_NaN();
  }
  return 0;
}

// Rows [r0, r1) of y[m, k] (bf16 bits) = dequant(w[m, rb bytes]): the q4 prefill's per-layer weight.
template <int BITS>
int dequant_rows(const uint8_t* w, uint16_t* y, int m, int k, int group, int mins, int rb, int r0, int r1) {
  if (m <= 0 || k <= 0 || group <= 0 || k % group || r0 < 0 || r1 > m || r0 >= r1) return -2;
  const int groups = k / group;
  for (int r = r0; r < r1; ++r) {
    const uint8_t* row = w + static_cast<size_t>(r) * rb;
    const uint8_t* sc = row + k * BITS / 8;
    const uint8_t* mn = sc + 2 * groups;
    uint16_t* out = y + static_cast<size_t>(r) * k;
    for (int g = 0; g < groups; ++g) {
      const float d = bf16_at(sc + 2 * g), z = mins ? bf16_at(mn + 2 * g) : 0.0f;
#ifdef LLAMA_NPU_Q4_AVX2
      const __m256 dv = _mm256_set1_ps(d), zv = _mm256_set1_ps(z);
      for (int j = g * group; j < (g + 1) * group; j += 8) {     // the same f32 ops, 8 lanes at a time
        __m256 wv = _mm256_mul_ps(dv, codes8<BITS>(row, j, mins));
        if (mins) wv = _mm256_add_ps(wv, zv);
        const __m256i u = _mm256_srli_epi32(_mm256_castps_si256(round_bf16_8(wv)), 16);
        _mm_storeu_si128(reinterpret_cast<__m128i*>(out + j),
                         _mm_packus_epi32(_mm256_castsi256_si128(u), _mm256_extracti128_si256(u, 1)));
      }
      continue;
#endif
      for (int j = g * group; j < (g + 1) * group; ++j) {
        float wv = d * static_cast<float>(code<BITS>(row, j, mins));
        if (mins) wv = wv + z;
        uint32_t u;
        const float rv = round_bf16(wv);
        std::memcpy(&u, &rv, sizeof u);
        out[j] = static_cast<uint16_t>(u >> 16);
      }
    }
  }
  return 0;
}

}  // namespace

extern "C" {

int llama_npu_dequant_q4(const uint8_t* w, uint16_t* y, int m, int k, int group, int mins, int rb, int bits,
                         int r0, int r1) {
  return bits == 8 ? dequant_rows<8>(w, y, m, k, group, mins, rb, r0, r1)
                   : dequant_rows<4>(w, y, m, k, group, mins, rb, r0, r1);
}

int llama_npu_gemv_q4(const uint8_t* w, const float* x, float* y, int m, int k, int group, int mins, int rb,
                      int r0, int r1) {
  return gemv_rows<4>(w, x, y, m, k, group, mins, rb, r0, r1);
}

// The same on 8-bit codes (a GGUF's Q8_0 vocabulary matrix).
int llama_npu_gemv_q8(const uint8_t* w, const float* x, float* y, int m, int k, int group, int mins, int rb,
                      int r0, int r1) {
  return gemv_rows<8>(w, x, y, m, k, group, mins, rb, r0, r1);
}

}  // extern "C"
