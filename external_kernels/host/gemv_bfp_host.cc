// y = W x for the emulator's block-float decode GEMVs (kernel_builder/gemv_bfp/host.py), reading the weight's bytes
// at rest (kernel_builder/block_float.py: [m/8, 9k], 8x8 blocks of 72 bytes, each 8 rows x [E, m0 .. m7]) with the
// numerics of external_kernels/gemv_bfp.cc (kernel_builder/gemv_bfp/reference.py):
//   x rounded to block float per 8 values (exponent e of the largest magnitude, mantissas round-half-even(x /
//   2^(e-6)) clipped to [-128, 127]; a group holding inf/NaN is NaN), then per row and K block in ascending order
//   s = float(double(s) + dot), dot = (sum of the 8 integer mantissa products) * 2^(ex + ew - 12), exact.
// The bits equal the numpy reference's (tests/test_gemv_bfp.py).
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

namespace {

constexpr int kBlk = 8;
constexpr int kBlkBytes = 72;

inline double pow2(int e) {   // 2^e as a double for -1022 <= e <= 1023 (the products' scales stay far inside)
  const uint64_t bits = static_cast<uint64_t>(e + 1023) << 52;
  double d;
  std::memcpy(&d, &bits, sizeof d);
  return d;
}

}  // namespace

extern "C" {

// Rows [r0, r1) (multiples of 8) of y[m] = W[m, k] . x[k]; w the at-rest bytes, x f32 (bf16 values).
// Returns 0, or -2 for bad shapes.
int llama_npu_gemv_bfp(const uint8_t* w, const float* x, float* y, int m, int k, int r0, int r1) {
  if (m <= 0 || k <= 0 || m % kBlk || k % kBlk || r0 < 0 || r1 > m || r0 >= r1 || r0 % kBlk || r1 % kBlk)
    return -2;
  const int kb_n = k / kBlk;
  std::vector<int32_t> xm(static_cast<size_t>(k));
  std::vector<int> xe(static_cast<size_t>(kb_n));
  std::vector<char> xnan(static_cast<size_t>(kb_n));
  for (int b = 0; b < kb_n; ++b) {
    float amax = 0.0f;
    bool finite = true;
    for (int i = 0; i < kBlk; ++i) {
      const float v = x[kBlk * b + i];
      finite = finite && std::isfinite(v);
      amax = std::fabs(v) > amax ? std::fabs(v) : amax;
    }
    const int e = finite && amax > 0.0f ? std::ilogb(amax) : 0;
    xe[b] = e;
    xnan[b] = !finite;
    for (int i = 0; i < kBlk; ++i) {
      double q = finite ? std::nearbyint(std::ldexp(static_cast<double>(x[kBlk * b + i]), 6 - e)) : 0.0;
      q = q > 127.0 ? 127.0 : (q < -128.0 ? -128.0 : q);
      xm[kBlk * b + i] = static_cast<int32_t>(q);
    }
  }
  const size_t row_bytes = static_cast<size_t>(kb_n) * kBlkBytes;
  for (int rb = r0 / kBlk; rb < r1 / kBlk; ++rb) {
    const uint8_t* br = w + rb * row_bytes;
    for (int r = 0; r < kBlk; ++r) {
      float s = 0.0f;
      for (int b = 0; b < kb_n; ++b) {
        const uint8_t* g = br + static_cast<size_t>(b) * kBlkBytes + r * (kBlk + 1);
        int32_t dot = 0;
        for (int i = 0; i < kBlk; ++i) dot += xm[kBlk * b + i] * static_cast<int8_t>(g[1 + i]);
        const double d = xnan[b] ? NAN : dot * pow2(xe[b] + static_cast<int>(g[0]) - 127 - 12);
        s = static_cast<float>(static_cast<double>(s) + d);
      }
      y[rb * kBlk + r] = s;
    }
  }
  return 0;
}

}  // extern "C"
