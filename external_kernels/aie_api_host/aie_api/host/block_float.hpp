// Host aie_api, part 2b: the block-float element type bfp16ebs8 and aie::block_vector (aie_api aie2p
// block_vector / bfp16ebs8; a v64bfp16ebs8 register holds 64 values as 8 blocks of 8 sharing one exponent each).
// Only what external_kernels/gemm.cc uses: accum<accfloat, 64>::to_vector<bfp16ebs8>() makes one, and
// aie::mmul<8, 8, 8, bfp16ebs8, bfp16ebs8> (host/mmul.hpp) consumes two. See docs/aie-api-host.md ("Block float").
#pragma once

#include "core.hpp"

struct bfp16ebs8 {};  // the tag type aie_api names (8-bit mantissas, one 8-bit exponent per 8 values)

namespace aie_host {

// bfp16ebs8 model (docs/aie-api-host.md, "Block float"): a block of 8 values shares the exponent E of its largest
// magnitude; each value keeps a signed 8-bit mantissa m = round(x / 2^(E-6)) in [-128, 127] (two's complement,
// one integer bit and six fraction bits relative to 2^E), rounded with the core's rounding mode (conv_even:
// nearest even, floor: toward -inf). A block holding inf/NaN becomes NaN. ASSUMPTION: AMD publishes no bit-level
// description; this is the MX-style int8 layout, documented as ours.
inline void to_bfp16_block(const float *x, float *q) {
  float amax = 0.0f;
  bool finite = true;
  for (int i = 0; i < 8; ++i) {
    if (!std::isfinite(x[i])) finite = false;
    amax = std::fabs(x[i]) > amax ? std::fabs(x[i]) : amax;
  }
  if (!finite) {
    for (int i = 0; i < 8; ++i) q[i] = NAN;
    return;
  }
  if (amax == 0.0f) {
    for (int i = 0; i < 8; ++i) q[i] = 0.0f;
    return;
  }
  const int e = std::ilogb(amax);
  for (int i = 0; i < 8; ++i) {
    const double s = std::ldexp(static_cast<double>(x[i]), 6 - e);  // exact
    double m = rounding == aie::rounding_mode::floor ? std::floor(s) : std::nearbyint(s);  // nearbyint: ties even
    m = m > 127.0 ? 127.0 : (m < -128.0 ? -128.0 : m);
    q[i] = static_cast<float>(std::ldexp(m, e - 6));
  }
}

}  // namespace aie_host

namespace aie {

// A block vector of N values in blocks of 8 consecutive lanes; the host keeps each value's quantized magnitude
// as a float (exact: 8-bit mantissa times a power of two). AIE2P's register is v64bfp16ebs8: N = 64 only.
template <typename T, unsigned N>
struct block_vector {
  static_assert(std::is_same_v<T, bfp16ebs8>, "aie_api_host: only bfp16ebs8 block vectors are modelled");
  static_assert(N == 64, "aie::block_vector<bfp16ebs8, N>: the AIE2P register holds 64 values (v64bfp16ebs8)");
  float q[N];
};

namespace detail_host {
template <unsigned N>
block_vector<bfp16ebs8, N> to_block_vector(const float *d) {  // accfloat -> bfp16ebs8, one conversion
  aie_host::count(aie_host::k_bfp16_convert);
  block_vector<bfp16ebs8, N> r;
  for (unsigned b = 0; b < N; b += 8) aie_host::to_bfp16_block(d + b, r.q + b);
  return r;
}
}  // namespace detail_host

}  // namespace aie
