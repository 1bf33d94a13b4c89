// Causal GQA attention for the emulator, on the host CPU (kernel_builder/attention/host.py loads it).
//
// f32 arithmetic in one fixed order per output element, whatever the chunk a query row runs in (any number
// of rows, any start position) and alone in decode, so a row always gives the same bits:
//   s_j = q . k_j        fma over d = 0..hd-1, from +0
//   x_j = max((s_j - max_j s_j) * scale, -87)      (exp of a lower x would be an f32 denormal)
//   p_j = exp(x_j)       the polynomial below, the same operations in the vector and the scalar path
//   l   = sum_j p_j      8 partial sums (key j into partial j mod 8, in key order), then a fixed tree
//   o   = (sum_j p_j v_j) / l    fma over keys in key order, from +0
// Keys past a row's position weigh exactly 0 (adding +0 products changes no finite sum), so reading more keys
// than a row sees (a block of rows, a 16-key tile) never changes its result. (An inf or NaN value at a later
// row of the same chunk does reach the earlier rows, 0 * inf being NaN: as in the numpy path.) NaN and inf
// scores take the same course in both paths.
//
// The AVX2+FMA path runs when the compiler targets such a CPU; the scalar path performs the same IEEE
// operations (std::fma, round-to-nearest-even, mul, add, div) in the same order and gives identical bits
// (a test builds both and compares).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#if defined(__AVX2__) && defined(__FMA__) && !defined(LLAMA_NPU_SCALAR_ONLY)
#include <immintrin.h>
#define LLAMA_NPU_AVX2 1
#endif

// The three passes stay separate functions: inlined into the block loop, GCC spills the accumulator tiles
// (measured: half the speed).
#if defined(__GNUC__)
#define LLAMA_NPU_NOINLINE __attribute__((noinline))
#else
#define LLAMA_NPU_NOINLINE
#endif

namespace {

constexpr int kRows = 4;    // query rows per block (one query head)
constexpr int kLanes = 8;   // partial sums of l; keys per vector
constexpr int kTile = 16;   // keys per score tile; kv rows are padded to a multiple of this

constexpr float kLog2e = 1.44269504088896341f;
constexpr float kLn2Hi = 0.693359375f;        // ln 2 = kLn2Hi + kLn2Lo, kLn2Hi with few mantissa bits
constexpr float kLn2Lo = -2.12194440e-4f;
constexpr float kFloor = -87.0f;              // exp(-87) = 1.6e-38 > FLT_MIN = 1.2e-38
// e^r on |r| <= ln2/2: Taylor terms to r^6 (relative error < 2e-7, about one f32 ulp)
constexpr float kC6 = 1.0f / 720.0f, kC5 = 1.0f / 120.0f, kC4 = 1.0f / 24.0f, kC3 = 1.0f / 6.0f, kC2 = 0.5f;

inline float exp_floored(float x) {   // x in [kFloor, 0]
  const float n = std::nearbyint(x * kLog2e);
  float r = std::fma(n, -kLn2Hi, x);
  r = std::fma(n, -kLn2Lo, r);
  float p = kC6;
  p = std::fma(p, r, kC5);
  p = std::fma(p, r, kC4);
  p = std::fma(p, r, kC3);
  p = std::fma(p, r, kC2);
  p = std::fma(p, r, 1.0f);
  p = std::fma(p, r, 1.0f);
  // 2^n, n in [-126, 0] (lrint, not a cast: a NaN x gives a defined garbage exponent, and p is NaN anyway)
  const uint32_t bits = (static_cast<uint32_t>(std::lrint(n)) + 127u) << 23;
  float two_n;
  std::memcpy(&two_n, &bits, sizeof two_n);
  return p * two_n;
}

// max as _mm256_max_ps(a, b) computes it, NaN included (b when either is NaN): both paths use this rule.
inline float vmax(float a, float b) { return a > b ? a : b; }

inline float tree8(const float* a) { return ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7])); }

#ifdef LLAMA_NPU_AVX2
inline __m256 exp_floored8(__m256 x) {
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(kLog2e)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fmadd_ps(n, _mm256_set1_ps(-kLn2Hi), x);
  r = _mm256_fmadd_ps(n, _mm256_set1_ps(-kLn2Lo), r);
  __m256 p = _mm256_set1_ps(kC6);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kC5));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kC4));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kC3));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kC2));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}
#endif

struct Head {          // one kv head's keys and values, and the shapes
  const float* kt;     // [npad / 16][hd][16]: tiles of 16 keys, transposed (one tile is contiguous)
  const float* v;      // [hd / 16][npad][16]: 16-column slices of the values (one slice is contiguous)
  int hd, npad;
  float scale;
};

// s[i][j] = q_i . k_j for j < nk (a multiple of kTile) and the kRows rows of q.
LLAMA_NPU_NOINLINE void scores(const Head& H, const float* const* q, int nk, float* s) {
  const int hd = H.hd, npad = H.npad;
#ifdef LLAMA_NPU_AVX2
  for (int j = 0; j < nk; j += kTile) {
    __m256 a[kRows][2];
#pragma GCC unroll 8
    for (int i = 0; i < kRows; ++i) a[i][0] = a[i][1] = _mm256_setzero_ps();
    for (int d = 0; d < hd; ++d) {
      const float* kd = H.kt + (static_cast<size_t>(j / kTile) * hd + d) * kTile;
      const __m256 k0 = _mm256_loadu_ps(kd), k1 = _mm256_loadu_ps(kd + 8);
#pragma GCC unroll 8
      for (int i = 0; i < kRows; ++i) {
        const __m256 qd = _mm256_broadcast_ss(q[i] + d);
        a[i][0] = _mm256_fmadd_ps(qd, k0, a[i][0]);
        a[i][1] = _mm256_fmadd_ps(qd, k1, a[i][1]);
      }
    }
    for (int i = 0; i < kRows; ++i) {
      _mm256_storeu_ps(s + static_cast<size_t>(i) * npad + j, a[i][0]);
      _mm256_storeu_ps(s + static_cast<size_t>(i) * npad + j + 8, a[i][1]);
    }
  }
#else
  for (int i = 0; i < kRows; ++i) {
    float* si = s + static_cast<size_t>(i) * npad;
    std::fill(si, si + nk, 0.0f);
    for (int d = 0; d < hd; ++d)
      for (int j = 0; j < nk; ++j)
        si[j] = std::fma(q[i][d], H.kt[(static_cast<size_t>(j / kTile) * hd + d) * kTile + j % kTile], si[j]);
  }
#endif
}

// In place: s[j] -> p[j] for j <= last, 0 for last < j < nk; returns l = sum p (fixed order).
LLAMA_NPU_NOINLINE float softmax_row(float* s, int last, int nk, float scale) {
  const int full = (last + 1) / kLanes * kLanes;
  float m = s[0];
  int rest = 1;                                 // first key the scalar loop below still has to look at
  if (full) {   // the maximum: 8 lanes (key j in lane j mod 8), then the lanes, then the tail; NaNs alike
    float lanes[kLanes];
#ifdef LLAMA_NPU_AVX2
    __m256 mx = _mm256_loadu_ps(s);
    for (int j = kLanes; j < full; j += kLanes) mx = _mm256_max_ps(mx, _mm256_loadu_ps(s + j));
    _mm256_storeu_ps(lanes, mx);
#else
    std::memcpy(lanes, s, sizeof lanes);
    for (int j = kLanes; j < full; ++j) lanes[j % kLanes] = vmax(lanes[j % kLanes], s[j]);
#endif
    m = lanes[0];
    for (int t = 1; t < kLanes; ++t) m = vmax(m, lanes[t]);
    rest = full;
  }
  for (int j = rest; j <= last; ++j) m = vmax(m, s[j]);
  float part[kLanes] = {0, 0, 0, 0, 0, 0, 0, 0};
#ifdef LLAMA_NPU_AVX2
  const __m256 mv = _mm256_set1_ps(m), sv = _mm256_set1_ps(scale), fv = _mm256_set1_ps(kFloor);
  __m256 acc = _mm256_setzero_ps();
  for (int j = 0; j < full; j += kLanes) {
    const __m256 x = _mm256_max_ps(fv, _mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(s + j), mv), sv));
    const __m256 p = exp_floored8(x);
    _mm256_storeu_ps(s + j, p);
    acc = _mm256_add_ps(acc, p);
  }
  _mm256_storeu_ps(part, acc);
#else
  for (int j = 0; j < full; ++j) {
    s[j] = exp_floored(vmax(kFloor, (s[j] - m) * scale));
    part[j % kLanes] += s[j];
  }
#endif
  for (int j = full; j <= last; ++j) {
    s[j] = exp_floored(vmax(kFloor, (s[j] - m) * scale));
    part[j % kLanes] += s[j];
  }
  for (int j = last + 1; j < nk; ++j) s[j] = 0.0f;
  return tree8(part);
}

// o_i = (sum_{j < nk} p_i[j] v_j) / l_i for the kRows rows.
LLAMA_NPU_NOINLINE void weighted_values(const Head& H, const float* p, int nk, const float* l, float* const* o) {
  const int hd = H.hd, npad = H.npad;
#ifdef LLAMA_NPU_AVX2
  for (int d = 0; d < hd; d += 16) {
    __m256 a[kRows][2];
#pragma GCC unroll 8
    for (int i = 0; i < kRows; ++i) a[i][0] = a[i][1] = _mm256_setzero_ps();
    for (int j = 0; j < nk; ++j) {
      const float* vj = H.v + (static_cast<size_t>(d / kTile) * npad + j) * kTile;
      const __m256 v0 = _mm256_loadu_ps(vj), v1 = _mm256_loadu_ps(vj + 8);
#pragma GCC unroll 8
      for (int i = 0; i < kRows; ++i) {
        const __m256 pj = _mm256_broadcast_ss(p + static_cast<size_t>(i) * npad + j);
        a[i][0] = _mm256_fmadd_ps(pj, v0, a[i][0]);
        a[i][1] = _mm256_fmadd_ps(pj, v1, a[i][1]);
      }
    }
    for (int i = 0; i < kRows; ++i) {
      const __m256 li = _mm256_set1_ps(l[i]);
      _mm256_storeu_ps(o[i] + d, _mm256_div_ps(a[i][0], li));
      _mm256_storeu_ps(o[i] + d + 8, _mm256_div_ps(a[i][1], li));
    }
  }
#else
  for (int i = 0; i < kRows; ++i) {
    const float* pi = p + static_cast<size_t>(i) * npad;
    for (int d = 0; d < hd; ++d) {
      float a = 0.0f;
      for (int j = 0; j < nk; ++j) a = std::fma(pi[j], H.v[(static_cast<size_t>(d / kTile) * npad + j) * kTile + d % kTile], a);
      o[i][d] = a / l[i];
    }
  }
#endif
}

}  // namespace

extern "C" {

// 1 when built with the AVX2+FMA path, 0 for the scalar path (same results; for tests and reports).
int llama_npu_attention_vector_path() {
#ifdef LLAMA_NPU_AVX2
  return 1;
#else
  return 0;
#endif
}

// The kernel's layouts (see Head) from the cache's own: k, v are [>= n, kv_heads * hd] (position-major, every
// kv head's vector of a position in one row); kt, vt receive [kv_heads][npad / 16][hd][16] and
// [kv_heads][hd / 16][npad][16], positions n..npad-1 zero. Returns 0, or -2 for bad shapes.
int llama_npu_attention_pack(const float* k, const float* v, int n, int kv_heads, int hd, int npad, float* kt,
                             float* vt) {
  if (n <= 0 || kv_heads <= 0 || hd % kTile || npad % kTile || n > npad) return -2;
  const size_t width = static_cast<size_t>(kv_heads) * hd;
  for (int h = 0; h < kv_heads; ++h) {
    float* kth = kt + static_cast<size_t>(h) * hd * npad;
    float* vth = vt + static_cast<size_t>(h) * hd * npad;
    for (int t = 0; t < npad / kTile; ++t)
      for (int d = 0; d < hd; ++d) {
        float* dst = kth + (static_cast<size_t>(t) * hd + d) * kTile;
        for (int l = 0; l < kTile; ++l) {
          const int j = t * kTile + l;
          dst[l] = j < n ? k[j * width + static_cast<size_t>(h) * hd + d] : 0.0f;
        }
      }
    for (int c = 0; c < hd / kTile; ++c)
      for (int j = 0; j < npad; ++j) {
        float* dst = vth + (static_cast<size_t>(c) * npad + j) * kTile;
        if (j < n)
          std::memcpy(dst, v + j * width + static_cast<size_t>(h) * hd + c * kTile, sizeof(float) * kTile);
        else
          std::memset(dst, 0, sizeof(float) * kTile);
      }
  }
  return 0;
}

// Query rows [r0, r1) of the query heads of kv head h. q, out: [rows, heads * hd] (query head qh at
// columns qh*hd..); kt: [kv_heads][npad / 16][hd][16], v: [kv_heads][hd / 16][npad][16] (see Head); keys
// at positions >= pos + rows are zero padding (npad is a multiple of 16). Row r is at position pos + r and sees keys 0..pos + r.
// Returns 0, or -1 when the work buffer cannot be allocated, -2 for bad shapes.
int llama_npu_attention(const float* q, const float* kt, const float* v, float* out, int rows, int pos,
                        int heads, int kv_heads, int hd, int npad, float scale, int h, int r0, int r1) {
  if (rows <= 0 || pos < 0 || kv_heads <= 0 || heads % kv_heads || hd % 16 || npad % kTile ||
      pos + rows > npad || h < 0 || h >= kv_heads || r0 < 0 || r1 > rows || r0 >= r1)
    return -2;
  const int group = heads / kv_heads;
  const Head H{kt + static_cast<size_t>(h) * hd * npad, v + static_cast<size_t>(h) * npad * hd, hd, npad, scale};
  // scores of kRows rows, then the outputs of the padding rows of a short block (never read)
  float* s = static_cast<float*>(std::malloc(sizeof(float) * kRows * (static_cast<size_t>(npad) + hd)));
  if (!s) return -1;
  float* junk = s + static_cast<size_t>(kRows) * npad;
  const size_t row_stride = static_cast<size_t>(heads) * hd;
  // Work units are (row, query head of this kv head) pairs, query head fastest: a block of kRows pairs spans
  // one or two rows (in decode, the group's heads at the one row), so it reads barely more keys than each needs.
  const int first = r0 * group, end = r1 * group;
  for (int b = first; b < end; b += kRows) {
    const int nr = std::min(kRows, end - b);
    const float* qi[kRows];
    float* oi[kRows];
    int at[kRows];
    float l[kRows];
    for (int i = 0; i < kRows; ++i) {
      const int t = b + std::min(i, nr - 1);       // short block: repeat the last pair
      const int r = t / group, qh = h * group + t % group;
      qi[i] = q + r * row_stride + static_cast<size_t>(qh) * hd;
      oi[i] = i < nr ? out + r * row_stride + static_cast<size_t>(qh) * hd : junk + i * hd;
      at[i] = pos + r;
    }
    const int last = at[kRows - 1];                 // the pairs are in row order: the last one sees the most
    const int nk = (last + 1 + kTile - 1) / kTile * kTile;
    scores(H, qi, nk, s);
    for (int i = 0; i < kRows; ++i) l[i] = softmax_row(s + static_cast<size_t>(i) * npad, at[i], nk, scale);
    weighted_values(H, s, nk, l, oi);
  }
  std::free(s);
  return 0;
}

}  // extern "C"
