// y = dequant(W) x for the emulator's 4-bit decode GEMVs (kernel_builder/gemv_q4/reference.py), reading the q4
// rows as stored (docs/quantization.md): a quarter of the bf16 weight bytes per token.
//
// Each weight is dequantized exactly as the AIE2P kernel does (w = bf16_rne(d * q + m) in f32, or bf16_rne(d * q)
// for signed codes) and then accumulated in the order of gemv_host.cc (32 partial sums, fma, a fixed tree), so
// the result equals the bf16 host GEMV on the dequantized weights bit for bit. The AVX-512, AVX2+FMA and scalar
// paths perform the same operations in the same order (per weight: the f32 product and sum, one RNE rounding, one
// fma into the partial sum of its position j % 32).
//
// The AVX-512 path (the emulator's decode on a CPU that has it; rows_512 below): a 4-bit group has 16 distinct
// weights, looked up with one permute from a table of the group's 16 dequantized codes; 8-bit codes are
// dequantized 32 at a time. Two rows run at once (sharing the loads of x), the next rows are prefetched (a row is
// read from its scales first), and a row's 32 partial sums are added in tree()'s order 16 lanes at a time. With
// AVX512-BF16 one vcvtne2ps2bf16 rounds 32 values (for rows whose scales and mins keep it exact: tame_row).
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#if defined(__AVX2__) && defined(__FMA__) && !defined(LLAMA_NPU_SCALAR_ONLY)
#include <immintrin.h>
#define LLAMA_NPU_Q4_AVX2 1
#endif
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(LLAMA_NPU_Q4_AVX2) && !defined(LLAMA_NPU_NO_AVX512)
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
#if defined(__AVX512BF16__) && !defined(LLAMA_NPU_NO_BF16CVT)
#define LLAMA_NPU_Q4_BF16CVT 1     // vcvtne2ps2bf16: 32 RNE roundings in one instruction
#endif

inline __m512 round_bf16_16(__m512 f) {
  const __m512i u = _mm512_castps_si512(f);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  const __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), lsb));
  return _mm512_castsi512_ps(_mm512_and_si512(r, _mm512_set1_epi32(static_cast<int>(0xffff0000u))));
}

// The 32 f32 of (lo, hi) rounded to bf16 (RNE) and split: e[j] = element 2j, o[j] = element 2j + 1, as f32. HW:
// one vcvtne2ps2bf16 (words 0..15 = lo, 16..31 = hi; a 32-bit lane holds elements 2j and 2j + 1), which equals
// round_bf16 on every f32 that is zero or normal and not a NaN (it treats a subnormal as zero): the caller only
// passes rows whose scales and mins keep every product and sum there (tame_row).
template <bool HW>
inline void round_split(__m512 lo, __m512 hi, __m512& e, __m512& o) {
#ifdef LLAMA_NPU_Q4_BF16CVT
  if (HW) {
    const __m512i v = reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(hi, lo));
    e = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
    o = _mm512_castsi512_ps(_mm512_and_si512(v, _mm512_set1_epi32(static_cast<int>(0xffff0000u))));
    return;
  }
#endif
  const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
  lo = round_bf16_16(lo);
  hi = round_bf16_16(hi);
  e = _mm512_permutex2var_ps(lo, even, hi);
  o = _mm512_permutex2var_ps(lo, odd, hi);
}

// A row's scales (and mins) as f32 in sf[0, groups) (mf), zero up to a multiple of 16; true when each is zero
// or a bf16 of magnitude in [2^-100, 2^120): then every d * q of the row (|q| < 256: at most 8 + 8 significant
// bits) is exact and finite, so fma(d, q, m) is the product and sum's one rounding, and every d * q + m is zero or
// normal, where the HW rounding gives round_bf16's bits.
inline bool tame_row(const uint8_t* sc, int groups, int mins, float* sf, float* mf) {
  __mmask16 wild = 0;
  for (int t = 0; t < 1 + mins; ++t)
    for (int g = 0; g < groups; g += 16) {
      const __mmask16 in = groups - g >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << (groups - g)) - 1);
      const __m512i u = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(in, sc + 2 * (g + t * groups)));
      const __m512i e = _mm512_and_si512(_mm512_srli_epi32(u, 7), _mm512_set1_epi32(0xff));
      wild |= _mm512_test_epi32_mask(u, _mm512_set1_epi32(0x7fff)) &
              (_mm512_cmplt_epi32_mask(e, _mm512_set1_epi32(27)) | _mm512_cmpgt_epi32_mask(e, _mm512_set1_epi32(246)));
      _mm512_storeu_ps((t ? mf : sf) + g, _mm512_castsi512_ps(_mm512_slli_epi32(u, 16)));
    }
  if (!mins)
    for (int g = 0; g < groups; g += 16) _mm512_storeu_ps(mf + g, _mm512_setzero_ps());
  return wild == 0;
}

inline __m512 bcast2(const float* p) {     // p[0], p[1], p[0], p[1], ...
  double pair;
  std::memcpy(&pair, p, 8);
  return _mm512_castpd_ps(_mm512_set1_pd(pair));
}

// One row of a rows_512 call: its codes, its scales and mins (tame_row), its two accumulators (kept as named
// members of a local: the compiler holds them in registers, which it does not do for an array of them).
struct Row512 {
  const uint8_t* codes;
  const float *sf, *mf;
  __m512 a0, a1;
};

// The 16-entry tables of groups g and g + 1 of a 4-bit row: bf16(d * q (+ m)) for the codes q = 0..15 (the same
// f32 ops as per weight), d and m of the two groups in alternate lanes, one rounding of the 32 values.
template <int MINS, bool HW>
inline void tables_q4(const Row512& row, int g, __m512& t0, __m512& t1) {
  const __m512 nib_lo = _mm512_setr_ps(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
  const __m512 nib_hi = MINS ? _mm512_setr_ps(8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13, 14, 14, 15, 15)
                             : _mm512_setr_ps(-8, -8, -7, -7, -6, -6, -5, -5, -4, -4, -3, -3, -2, -2, -1, -1);
  const __m512 d = bcast2(row.sf + g);
  __m512 lo, hi;
  if (MINS && HW) {     // a tame row: d * q is exact, the fma rounds once as the add does
    const __m512 z = bcast2(row.mf + g);
    lo = _mm512_fmadd_ps(d, nib_lo, z);
    hi = _mm512_fmadd_ps(d, nib_hi, z);
  } else {
    lo = _mm512_mul_ps(d, nib_lo);
    hi = _mm512_mul_ps(d, nib_hi);
    if (MINS) {
      const __m512 z = bcast2(row.mf + g);
      lo = _mm512_add_ps(lo, z);
      hi = _mm512_add_ps(hi, z);
    }
  }
  round_split<HW>(lo, hi, t0, t1);
}

// 32 weights of a 4-bit row from position j (16 bytes: low nibbles the even positions, high nibbles the odd).
inline void step_q4(Row512& row, const __m512& table, int j, const __m512& xe, const __m512& xo) {
  const __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row.codes + j / 2)));
  // vpermps reads the low 4 bits of an index: the low nibble needs no mask
  row.a0 = _mm512_fmadd_ps(_mm512_permutexvar_ps(v, table), xe, row.a0);
  row.a1 = _mm512_fmadd_ps(_mm512_permutexvar_ps(_mm512_srli_epi32(v, 4), table), xo, row.a1);
}

// 32 weights of an 8-bit row from position j of group g: the HW rounding splits them into even and odd positions.
template <int MINS, bool HW>
inline void step_q8(Row512& row, int g, int j, const __m512& xe, const __m512& xo) {
  const __m512 d = _mm512_set1_ps(row.sf[g]);
  const __m128i c0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row.codes + j));
  const __m128i c1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row.codes + j + 16));
  __m512 w0 = _mm512_mul_ps(d, _mm512_cvtepi32_ps(MINS ? _mm512_cvtepu8_epi32(c0) : _mm512_cvtepi8_epi32(c0)));
  __m512 w1 = _mm512_mul_ps(d, _mm512_cvtepi32_ps(MINS ? _mm512_cvtepu8_epi32(c1) : _mm512_cvtepi8_epi32(c1)));
  if (MINS) {
    const __m512 z = _mm512_set1_ps(row.mf[g]);
    w0 = _mm512_add_ps(w0, z);
    w1 = _mm512_add_ps(w1, z);
  }
  __m512 we, wo;
  if (HW) {
    round_split<HW>(w0, w1, we, wo);
  } else {     // x in order (xo: positions 16..31); rows_512 splits the sums at the end
    we = round_bf16_16(w0);
    wo = round_bf16_16(w1);
  }
  row.a0 = _mm512_fmadd_ps(we, xe, row.a0);
  row.a1 = _mm512_fmadd_ps(wo, xo, row.a1);
}

// Rows p, q (R = 2) or p alone (R = 1): the same bits as the AVX2 and scalar paths. x is read de-interleaved (xd:
// even positions, then odd, per block of 32) and a row's two accumulators hold the partial sums of its even and
// odd positions. The rows are independent (each in one row's order); two at once share the loads of x.
template <int BITS, int MINS, int R, bool HW>
void rows_512(Row512& p, Row512& q, const float* xd, int k, int group) {
  const int groups = k / group;
  p.a0 = p.a1 = q.a0 = q.a1 = _mm512_setzero_ps();
  for (int g = 0; g < groups; g += BITS == 4 ? 2 : 1) {
    if (BITS == 4) {
      __m512 tp0, tp1, tq0, tq1;
      tables_q4<MINS, HW>(p, g, tp0, tp1);
      if (R == 2) tables_q4<MINS, HW>(q, g, tq0, tq1);
      for (int h = 0; h < 2 && g + h < groups; ++h)
        for (int j = (g + h) * group; j < (g + h + 1) * group; j += kParts) {
          const __m512 xe = _mm512_loadu_ps(xd + j), xo = _mm512_loadu_ps(xd + j + kParts / 2);
          step_q4(p, h ? tp1 : tp0, j, xe, xo);
          if (R == 2) step_q4(q, h ? tq1 : tq0, j, xe, xo);
        }
    } else {
      for (int j = g * group; j < (g + 1) * group; j += kParts) {
        const __m512 xe = _mm512_loadu_ps(xd + j), xo = _mm512_loadu_ps(xd + j + kParts / 2);
        step_q8<MINS, HW>(p, g, j, xe, xo);
        if (R == 2) step_q8<MINS, HW>(q, g, j, xe, xo);
      }
    }
  }
  if (BITS == 8 && !HW) {     // partial i in lane i of (a0, a1) -> a0 the even partials, a1 the odd ones
    const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
    for (Row512* row : {&p, &q}) {
      const __m512 e = _mm512_permutex2var_ps(row->a0, even, row->a1);
      row->a1 = _mm512_permutex2var_ps(row->a0, odd, row->a1);
      row->a0 = e;
    }
  }
}

// A row's sum: tree()'s additions on the partial sums in its two accumulators (a0 lane i = partial 2i, a1 lane
// i = partial 2i + 1), the same pairs in the same order, 16 lanes at a time.
inline void finish_512(const Row512& row, float* y) {
  const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 0, 2, 4, 6, 8, 10, 12, 14);
  const __m512i odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
  __m512 s = _mm512_add_ps(row.a0, row.a1);    // s[t] = part[2t] + part[2t + 1]: 16 sums
  for (int n = 8; n >= 1; n /= 2)               // s[t] = s[2t] + s[2t + 1] for t < n
    s = _mm512_add_ps(_mm512_permutexvar_ps(even, s), _mm512_permutexvar_ps(odd, s));
  const float v = _mm512_cvtss_f32(s);
  *y = v == v ? v : std::numeric_limits<float>::quiet_NaN();
}

// R (1 or 2) rows from `first`: their scales through tame_row, then rows_512 with the HW rounding when all are tame.
template <int BITS, int MINS, int R>
void block_512(const uint8_t* w, const float* xd, float* y, int k, int group, int rb, int first, float* buf) {
  const int groups = k / group, stride = (groups + 16) / 16 * 16;
  Row512 row[2];
  bool tame = true;
  for (int i = 0; i < R; ++i) {
    row[i].codes = w + static_cast<size_t>(first + i) * rb;
    float* sf = buf + 2 * i * stride;
    row[i].sf = sf;
    row[i].mf = sf + stride;
    tame = tame_row(row[i].codes + k * BITS / 8, groups, MINS, sf, sf + stride) && tame;
  }
  Row512 p = row[0], q = row[R - 1];
#ifdef LLAMA_NPU_Q4_BF16CVT
#ifdef LLAMA_NPU_Q4_UNGUARDED     // a test's mutant: the HW rounding on every row
  tame = true;
#endif
  if (tame)
    rows_512<BITS, MINS, R, true>(p, q, xd, k, group);
  else
#endif
    rows_512<BITS, MINS, R, false>(p, q, BITS == 8 ? xd + k : xd, k, group);
  finish_512(p, y + first);
  if (R == 2) finish_512(q, y + first + 1);
}

// Rows [r0, r1) on AVX-512 (shapes checked by the caller): 2 rows at a time, then the last one alone.
template <int BITS, int MINS>
void span_512(const uint8_t* w, const float* x, float* y, int k, int group, int rb, int r0, int r1) {
  constexpr int R = 2;
  std::vector<float> xd(2 * k), buf(2 * R * ((k / group + 16) / 16 * 16));
  for (int b = 0; b < k; b += kParts)     // per block of 32: x at the even positions, then at the odd ones
    for (int i = 0; i < kParts / 2; ++i) {
      xd[b + i] = x[b + 2 * i];
      xd[b + kParts / 2 + i] = x[b + 2 * i + 1];
    }
  std::memcpy(xd.data() + k, x, sizeof(float) * k);     // and x in order (8 bits without the HW rounding)
  int r = r0;
  for (; r + R <= r1; r += R) {
    // the next rows into the cache while these run: a row is read from its end (the scales) first
    const uint8_t* next = w + static_cast<size_t>(r + R) * rb;
    for (int off = 0; r + 2 * R <= r1 && off < R * rb; off += 64) _mm_prefetch(reinterpret_cast<const char*>(next + off), _MM_HINT_T0);
    block_512<BITS, MINS, R>(w, xd.data(), y, k, group, rb, r, buf.data());
  }
  for (; r < r1; ++r) block_512<BITS, MINS, 1>(w, xd.data(), y, k, group, rb, r, buf.data());
}

template <int BITS>
void gemv_rows_512(const uint8_t* w, const float* x, float* y, int k, int group, int mins, int rb, int r0, int r1) {
  if (mins)
    span_512<BITS, 1>(w, x, y, k, group, rb, r0, r1);
  else
    span_512<BITS, 0>(w, x, y, k, group, rb, r0, r1);
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
