// y = dequant(W) x for the emulator's 4-bit decode GEMVs (kernel_builder/gemv_q4/reference.py), reading the q4
// rows as stored (docs/quantization.md): a quarter of the bf16 weight bytes per token.
//
// Each weight is dequantized exactly as the AIE2P kernel does (w = bf16_rne(d * q + m) in f32, or bf16_rne(d * q)
// for signed codes) and then accumulated in the order of gemv_host.cc (32 partial sums, fma, a fixed tree), so
// the result equals the bf16 host GEMV on the dequantized weights bit for bit. The AVX-512, AVX2+FMA and scalar
// paths perform the same operations in the same order (per weight: the f32 product and sum, one RNE rounding, one
// fma into the partial sum of its position j % 32).
//
// The AVX-512 path (the emulator's decode on a CPU that has it): a 4-bit group has 16 distinct weights, so it
// dequantizes the 16 codes 0..15 once per group (the same f32 ops) into a 16-lane table and looks every weight up
// with one permute; the 16 bytes of 32 codes widen to 16 lanes whose low nibbles are the even positions and high
// nibbles the odd ones, so x is read de-interleaved (even positions, then odd, per block of 32: once per call) and
// the two accumulators hold the partial sums of the even and the odd positions. 8-bit codes: 16 lanes at a time.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#if defined(__AVX2__) && defined(__FMA__) && !defined(LLAMA_NPU_SCALAR_ONLY)
#include <immintrin.h>
#define LLAMA_NPU_Q4_AVX2 1
#endif
#if defined(__AVX512F__) && defined(LLAMA_NPU_Q4_AVX2) && !defined(LLAMA_NPU_NO_AVX512)
#define LLAMA_NPU_Q4_AVX512 1
#include <vector>
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

#ifdef LLAMA_NPU_Q4_AVX512
inline __m512 round_bf16_16(__m512 f) {
  const __m512i u = _mm512_castps_si512(f);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  const __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), lsb));
  return _mm512_castsi512_ps(_mm512_and_si512(r, _mm512_set1_epi32(static_cast<int>(0xffff0000u))));
}

// The bf16 at p (p - 2 is inside the row: the scales and mins follow the codes) as 16 f32 lanes: the 32-bit word
// ending at p + 2 holds it in its high half.
inline __m512 bf16_bcast(const uint8_t* p) {
  int32_t word;
  std::memcpy(&word, p - 2, 4);
  return _mm512_castsi512_ps(_mm512_and_si512(_mm512_set1_epi32(word), _mm512_set1_epi32(static_cast<int>(0xffff0000u))));
}

// One row's 32 partial sums on AVX-512 (MINS, BITS fixed at compile time): the same bits as the paths below.
template <int BITS, int MINS>
inline void row_512(const uint8_t* row, const float* x, const float* xd, int k, int group, float* part) {
  const int groups = k / group;
  const uint8_t* sc = row + k * BITS / 8;
  const uint8_t* mn = sc + 2 * groups;
  // the codes a nibble stands for: 0..15 with mins, two's complement -8..7 without
  const __m512 nibble = MINS ? _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15)
                             : _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, -8, -7, -6, -5, -4, -3, -2, -1);
  const __m512i low4 = _mm512_set1_epi32(0xF);
  __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
  for (int g = 0; g < groups; ++g) {
    const __m512 d = bf16_bcast(sc + 2 * g);
    const __m512 z = MINS ? bf16_bcast(mn + 2 * g) : _mm512_setzero_ps();
    if (BITS == 4) {
      __m512 lut = _mm512_mul_ps(d, nibble);        // the group's 16 weights: bf16(d * q (+ m))
      if (MINS) lut = _mm512_add_ps(lut, z);
      lut = round_bf16_16(lut);
      for (int j = g * group; j < (g + 1) * group; j += kParts) {
        const __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + j / 2)));
        const __m512 we = _mm512_permutexvar_ps(_mm512_and_si512(v, low4), lut);   // positions j + 2i
        const __m512 wo = _mm512_permutexvar_ps(_mm512_srli_epi32(v, 4), lut);     // positions j + 2i + 1
        a0 = _mm512_fmadd_ps(we, _mm512_loadu_ps(xd + j), a0);
        a1 = _mm512_fmadd_ps(wo, _mm512_loadu_ps(xd + j + kParts / 2), a1);
      }
    } else {
      for (int j = g * group; j < (g + 1) * group; j += kParts) {
        const __m128i c0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + j));
        const __m128i c1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + j + 16));
        __m512 w0 = _mm512_mul_ps(d, _mm512_cvtepi32_ps(MINS ? _mm512_cvtepu8_epi32(c0) : _mm512_cvtepi8_epi32(c0)));
        __m512 w1 = _mm512_mul_ps(d, _mm512_cvtepi32_ps(MINS ? _mm512_cvtepu8_epi32(c1) : _mm512_cvtepi8_epi32(c1)));
        if (MINS) {
          w0 = _mm512_add_ps(w0, z);
          w1 = _mm512_add_ps(w1, z);
        }
        a0 = _mm512_fmadd_ps(round_bf16_16(w0), _mm512_loadu_ps(x + j), a0);
        a1 = _mm512_fmadd_ps(round_bf16_16(w1), _mm512_loadu_ps(x + j + 16), a1);
      }
    }
  }
  float lanes[kParts];
  _mm512_storeu_ps(lanes, a0);
  _mm512_storeu_ps(lanes + 16, a1);
  for (int i = 0; i < kParts; ++i)     // 4 bits: lanes 0..15 are the even positions, 16..31 the odd ones
    part[i] = BITS == 4 ? lanes[(i % 2) * 16 + i / 2] : lanes[i];
}

// Rows [r0, r1) on AVX-512 (shapes checked by the caller).
template <int BITS>
void gemv_rows_512(const uint8_t* w, const float* x, float* y, int k, int group, int mins, int rb, int r0, int r1) {
  std::vector<float> xd;
  if (BITS == 4) {     // per block of 32: x at the even positions, then at the odd ones
    xd.resize(k);
    for (int b = 0; b < k; b += kParts)
      for (int i = 0; i < kParts / 2; ++i) {
        xd[b + i] = x[b + 2 * i];
        xd[b + kParts / 2 + i] = x[b + 2 * i + 1];
      }
  }
  for (int r = r0; r < r1; ++r) {
    const uint8_t* row = w + static_cast<size_t>(r) * rb;
    float part[kParts];
    if (mins)
      row_512<BITS, 1>(row, x, xd.data(), k, group, part);
    else
      row_512<BITS, 0>(row, x, xd.data(), k, group, part);
    const float v = tree(part, kParts);
    y[r] = v == v ? v : std::numeric_limits<float>::quiet_NaN();
  }
}
#endif

// Rows [r0, r1) of y[m] = dequant(w[m, rb bytes]) . x[k] (f32), BITS-bit codes. 0, or -2 for bad shapes.
template <int BITS>
int gemv_rows(const uint8_t* w, const float* x, float* y, int m, int k, int group, int mins, int rb, int r0,
              int r1) {
  if (m <= 0 || k <= 0 || group <= 0 || k % group || group % kParts || r0 < 0 || r1 > m || r0 >= r1) return -2;
#ifdef LLAMA_NPU_Q4_AVX512
  gemv_rows_512<BITS>(w, x, y, k, group, mins, rb, r0, r1);
  return 0;
#endif
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
