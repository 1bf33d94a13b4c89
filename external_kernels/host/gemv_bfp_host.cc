// y = W x for the emulator's block-float decode GEMVs (kernel_builder/gemv_bfp/host.py), reading the weight's bytes
// at rest (kernel_builder/block_float.py: [m/8, 9k], 8x8 blocks of 72 bytes, each 8 rows x [E, m0 .. m7]) with the
// numerics of external_kernels/gemv_bfp.cc (kernel_builder/gemv_bfp/reference.py):
//   x rounded to block float per 8 values (exponent e of the largest magnitude, mantissas round-half-even(x /
//   2^(e-6)) clipped to [-128, 127]; a group holding inf/NaN is NaN), then per row and K block in ascending order
//   s = float(double(s) + dot), dot = (sum of the 8 integer mantissa products) * 2^(ex + ew - 12), exact.
// The bits equal the numpy reference's (tests/test_gemv_bfp.py).
//
// The AVX-512 path (BW + VBMI + VNNI) takes a block row's 8 rows at once, one weight stream: per 72-byte block one
// byte permute gathers the 64 mantissas (4 of a row per int32 lane), one vpdpbusd forms the exact integer dots
// ((w + 128) * x summed per 4, the 128 * sum(x) term folded into the start value), a second byte permute picks the
// 8 exponents, and the scale 2^k is built from them as an f32 (x's mantissas are laid out once per call). When
// every nonzero dot's scale is a normal f32 (1 <= k + 127 <= 254), s = fma(dot, 2^k, s) rounds s + d once, and
// that equals float(double(s) + d): s and d carry at most 24 significant bits (|dot| < 2^18) on the f32 grid, and
// rounding their sum to 53 bits and then to 24 is the same as rounding it to 24 (double rounding is innocuous for
// p' >= 2p + 2, Figueroa 1995; an overflow to inf follows the same rounded value). A block row where some scale
// leaves that range (tiny x, E = 0 groups with nonzero mantissas) runs the exact path below; so does every row
// when x has a NaN/inf group.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#if defined(__AVX2__) && defined(__FMA__) && !defined(LLAMA_NPU_SCALAR_ONLY)
#include <immintrin.h>
#define LLAMA_NPU_BFP_AVX2 1
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512VBMI__) && \
    defined(__AVX512VNNI__) && !defined(LLAMA_NPU_NO_AVX512)
#define LLAMA_NPU_BFP_AVX512 1
#endif
#endif

namespace {

constexpr int kBlk = 8;
constexpr int kBlkBytes = 72;

inline double pow2(int e) {   // 2^e as a double for -1022 <= e <= 1023 (the products' scales stay far inside)
  const uint64_t bits = static_cast<uint64_t>(e + 1023) << 52;
  double d;
  std::memcpy(&d, &bits, sizeof d);
  return d;
}

struct XBlocks {              // x in block float, once per call
  std::vector<int8_t> m;      // [k] mantissas
  std::vector<int> e;         // [k/8] exponents
  bool nonfinite = false;     // some group holds inf/NaN: every row is NaN
};

#ifdef LLAMA_NPU_BFP_AVX512
// One group of 8 as the scalar code below: the same exponent, the same products (exact in double), the same
// round-half-even and clipping.
inline bool quantize_group(const float* x, int8_t* m, int* e) {
  const __m512d v = _mm512_cvtps_pd(_mm256_loadu_ps(x));
  if (_mm512_fpclass_pd_mask(v, 0x99)) {      // QNaN, SNaN, +inf, -inf
    *e = 0;
    _mm_storel_epi64(reinterpret_cast<__m128i*>(m), _mm_setzero_si128());
    return false;
  }
  const double amax = _mm512_reduce_max_pd(_mm512_abs_pd(v));
  uint64_t bits;
  std::memcpy(&bits, &amax, sizeof bits);
  *e = amax > 0.0 ? static_cast<int>((bits >> 52) & 0x7ff) - 1023 : 0;   // an f32's magnitude is a normal double
  const __m512d q = _mm512_roundscale_pd(_mm512_mul_pd(v, _mm512_set1_pd(pow2(6 - *e))),
                                         _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512d c = _mm512_min_pd(_mm512_max_pd(q, _mm512_set1_pd(-128.0)), _mm512_set1_pd(127.0));
  _mm_storel_epi64(reinterpret_cast<__m128i*>(m), _mm256_cvtepi32_epi8(_mm512_cvtpd_epi32(c)));
  return true;
}
#else
inline bool quantize_group(const float* x, int8_t* m, int* e) {
  float amax = 0.0f;
  bool finite = true;
  for (int i = 0; i < kBlk; ++i) {
    finite = finite && std::isfinite(x[i]);
    amax = std::fabs(x[i]) > amax ? std::fabs(x[i]) : amax;
  }
  *e = finite && amax > 0.0f ? std::ilogb(amax) : 0;
  const double scale = pow2(6 - *e);    // exact: x * 2^(6-e) stays a double
  for (int i = 0; i < kBlk; ++i) {
    double v = finite ? std::nearbyint(static_cast<double>(x[i]) * scale) : 0.0;
    v = v > 127.0 ? 127.0 : (v < -128.0 ? -128.0 : v);
    m[i] = static_cast<int8_t>(v);
  }
  return finite;
}
#endif

XBlocks quantize_x(const float* x, int k) {
  XBlocks q;
  const int kb_n = k / kBlk;
  q.m.resize(static_cast<size_t>(k));
  q.e.resize(static_cast<size_t>(kb_n));
  for (int b = 0; b < kb_n; ++b)
    if (!quantize_group(x + kBlk * b, &q.m[kBlk * b], &q.e[b])) q.nonfinite = true;
  return q;
}

// The 8 rows of block row `br` (row_bytes per block row) in the reference's order, with doubles.
void block_row_exact(const uint8_t* br, const XBlocks& q, int kb_n, float* y) {
  for (int r = 0; r < kBlk; ++r) {
    float s = 0.0f;
    for (int b = 0; b < kb_n; ++b) {
      const uint8_t* g = br + static_cast<size_t>(b) * kBlkBytes + r * (kBlk + 1);
      int32_t dot = 0;
      for (int i = 0; i < kBlk; ++i) dot += q.m[kBlk * b + i] * static_cast<int8_t>(g[1 + i]);
      const double d = q.nonfinite ? NAN : dot * pow2(q.e[b] + static_cast<int>(g[0]) - 127 - 12);
      s = static_cast<float>(static_cast<double>(s) + d);
    }
    y[r] = s;
  }
}

#ifdef LLAMA_NPU_BFP_AVX512
// Per K block: x's mantissas laid out against the permuted weight bytes (lane u = row u % 8, columns
// 4 (u / 8) .. +3), the start value -64 * sum(x) (two lanes per row: -128 * sum(x) in all), and k + 127 - E.
struct XLanes {
  std::vector<uint8_t> rep;   // [k/8, 64]
  std::vector<int32_t> start, ebias;
};

XLanes lay_out_x(const XBlocks& q, int kb_n) {
  XLanes l;
  l.rep.resize(static_cast<size_t>(kb_n) * 64);
  l.start.resize(static_cast<size_t>(kb_n));
  l.ebias.resize(static_cast<size_t>(kb_n));
  alignas(64) uint8_t idx[64];
  for (int i = 0; i < 64; ++i) idx[i] = static_cast<uint8_t>(4 * (i / 32) + i % 4);
  const __m512i vidx = _mm512_load_si512(idx);
  for (int b = 0; b < kb_n; ++b) {
    int64_t bits;
    std::memcpy(&bits, &q.m[kBlk * b], sizeof bits);
    _mm512_storeu_si512(&l.rep[64 * b], _mm512_permutexvar_epi8(vidx, _mm512_set1_epi64(bits)));
    int sum = 0;
    for (int i = 0; i < kBlk; ++i) sum += q.m[kBlk * b + i];
    l.start[b] = -64 * sum;
    l.ebias[b] = q.e[b] - 12;       // k + 127 = ex + E - 127 - 12 + 127
  }
  return l;
}

struct Perm {                 // byte indices into the 128 bytes [block[0..64), block[8..72)]
  __m512i mant, expo;
  Perm() {
    alignas(64) uint8_t m[64], e[64];
    for (int u = 0; u < 16; ++u)
      for (int j = 0; j < 4; ++j) {
        const int src = (u % 8) * (kBlk + 1) + 1 + 4 * (u / 8) + j;      // row u % 8, column 4 (u / 8) + j
        m[4 * u + j] = static_cast<uint8_t>(src < 64 ? src : 64 + src - 8);
      }
    for (int i = 0; i < 64; ++i) e[i] = static_cast<uint8_t>(i % 4 == 0 && i < 32 ? 9 * (i / 4) : 0);
    mant = _mm512_load_si512(m);
    expo = _mm512_load_si512(e);
  }
};

// The 8 rows of block row `br` into y[8]; returns false when some nonzero dot's scale is not a normal f32 (y is
// then not the reference's and the caller runs the exact path).
bool block_row_avx512(const uint8_t* br, const XLanes& xl, const Perm& p, int kb_n, float* y) {
  const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
  const __m256i one = _mm256_set1_epi32(127);          // the biased exponent of 1.0
  __m256 s = _mm256_setzero_ps();
  __m256i tmin = one, tmax = one;
  for (int b = 0; b < kb_n; ++b) {
    const uint8_t* g = br + static_cast<size_t>(b) * kBlkBytes;
    const __m512i lo = _mm512_loadu_si512(g);
    const __m512i hi = _mm512_loadu_si512(g + 8);
    const __m512i wu = _mm512_xor_si512(_mm512_permutex2var_epi8(lo, p.mant, hi), flip);   // w + 128, unsigned
    const __m512i xr = _mm512_loadu_si512(&xl.rep[64 * static_cast<size_t>(b)]);
    const __m512i acc = _mm512_dpbusd_epi32(_mm512_set1_epi32(xl.start[b]), wu, xr);   // exact: |dot| < 2^18
    const __m256i dot = _mm256_add_epi32(_mm512_castsi512_si256(acc), _mm512_extracti64x4_epi64(acc, 1));
    const __m256i ew = _mm512_castsi512_si256(_mm512_maskz_permutexvar_epi8(0x11111111ull, p.expo, lo));
    const __m256i t = _mm256_mask_add_epi32(one, _mm256_test_epi32_mask(dot, dot), ew,     // a zero dot: scale 1
                                            _mm256_set1_epi32(xl.ebias[b]));
    tmin = _mm256_min_epi32(tmin, t);
    tmax = _mm256_max_epi32(tmax, t);
    s = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_castsi256_ps(_mm256_slli_epi32(t, 23)), s);
  }
  _mm256_storeu_ps(y, s);
  const __mmask8 out = _mm256_cmplt_epi32_mask(tmin, _mm256_set1_epi32(1)) |
                       _mm256_cmpgt_epi32_mask(tmax, _mm256_set1_epi32(254));
  return out == 0;
}
#endif

#if defined(LLAMA_NPU_BFP_AVX2) && !defined(LLAMA_NPU_BFP_AVX512)
// The AVX2 form of the same: per block, rows p and p + 4 sign-extended to int16 in one register and multiplied
// with x's 8 mantissas in pairs (vpmaddwd), three horizontal adds giving the 8 rows' dots in order, the exponents
// gathered; the same f32 fma and the same range check.
bool block_row_avx2(const uint8_t* br, const int16_t* xm, const int32_t* ebias, int kb_n, float* y) {
  const __m256i one = _mm256_set1_epi32(127);
  const __m256i at9 = _mm256_setr_epi32(0, 9, 18, 27, 36, 45, 54, 63);
  __m256 s = _mm256_setzero_ps();
  __m256i tmin = one, tmax = one;
  for (int b = 0; b < kb_n; ++b) {
    const uint8_t* g = br + static_cast<size_t>(b) * kBlkBytes;
    const __m256i xv = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(xm + kBlk * b)));
    __m256i part[4];
    for (int p = 0; p < 4; ++p) {
      const __m128i lo = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(g + (kBlk + 1) * p + 1));
      const __m128i hi = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(g + (kBlk + 1) * (p + 4) + 1));
      part[p] = _mm256_madd_epi16(_mm256_cvtepi8_epi16(_mm_unpacklo_epi64(lo, hi)), xv);   // rows p | p + 4
    }
    const __m256i dot = _mm256_hadd_epi32(_mm256_hadd_epi32(part[0], part[1]), _mm256_hadd_epi32(part[2], part[3]));
    const __m256i ew = _mm256_and_si256(_mm256_i32gather_epi32(reinterpret_cast<const int*>(g), at9, 1),
                                        _mm256_set1_epi32(0xff));
    const __m256i t = _mm256_blendv_epi8(_mm256_add_epi32(ew, _mm256_set1_epi32(ebias[b])), one,
                                         _mm256_cmpeq_epi32(dot, _mm256_setzero_si256()));   // a zero dot: scale 1
    tmin = _mm256_min_epi32(tmin, t);
    tmax = _mm256_max_epi32(tmax, t);
    s = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_castsi256_ps(_mm256_slli_epi32(t, 23)), s);
  }
  _mm256_storeu_ps(y, s);
  const __m256i out = _mm256_or_si256(_mm256_cmpgt_epi32(_mm256_set1_epi32(1), tmin),
                                      _mm256_cmpgt_epi32(tmax, _mm256_set1_epi32(254)));
  return _mm256_testz_si256(out, out);
}
#endif

}  // namespace

extern "C" {

// Rows [r0, r1) (multiples of 8) of y[m] = W[m, k] . x[k]; w the at-rest bytes, x f32 (bf16 values).
// Returns 0, or -2 for bad shapes.
int llama_npu_gemv_bfp(const uint8_t* w, const float* x, float* y, int m, int k, int r0, int r1) {
  if (m <= 0 || k <= 0 || m % kBlk || k % kBlk || r0 < 0 || r1 > m || r0 >= r1 || r0 % kBlk || r1 % kBlk)
    return -2;
  const int kb_n = k / kBlk;
  const XBlocks q = quantize_x(x, k);
  const size_t row_bytes = static_cast<size_t>(kb_n) * kBlkBytes;
  int rb = r0 / kBlk;
#ifdef LLAMA_NPU_BFP_AVX512
  if (!q.nonfinite) {
    const XLanes xl = lay_out_x(q, kb_n);
    static const Perm perm;
    for (; rb < r1 / kBlk; ++rb)
      if (!block_row_avx512(w + rb * row_bytes, xl, perm, kb_n, y + rb * kBlk))
        block_row_exact(w + rb * row_bytes, q, kb_n, y + rb * kBlk);
  }
#elif defined(LLAMA_NPU_BFP_AVX2)
  if (!q.nonfinite) {
    std::vector<int16_t> xm(q.m.begin(), q.m.end());
    std::vector<int32_t> ebias(q.e.begin(), q.e.end());
    for (int32_t& e : ebias) e -= 12;
    for (; rb < r1 / kBlk; ++rb)
      if (!block_row_avx2(w + rb * row_bytes, xm.data(), ebias.data(), kb_n, y + rb * kBlk))
        block_row_exact(w + rb * row_bytes, q, kb_n, y + rb * kBlk);
  }
#endif
  for (; rb < r1 / kBlk; ++rb) block_row_exact(w + rb * row_bytes, q, kb_n, y + rb * kBlk);
  return 0;
}

}  // extern "C"
