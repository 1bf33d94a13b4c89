// Host aie_api, part 2b: the block-float element type bfp16ebs8 and aie::block_vector (aie_api aie2p
// block_vector / bfp16ebs8; a v64bfp16ebs8 register holds 64 values as 8 blocks of 8 sharing one exponent each).
// Only what external_kernels/gemm.cc uses: accum<accfloat, 64>::to_vector<bfp16ebs8>() makes one,
// aie::mmul<8, 8, 8, bfp16ebs8, bfp16ebs8> (host/mmul.hpp) consumes two, and the block-vector buffer streams
// (aie_api block_vector_output_buffer_stream / block_vector_input_buffer_stream, as mlir-aie's aie2p mm_bfp.cc
// uses them) store and reload one in memory. See docs/aie-api-host.md ("Block float").
#pragma once

#include "core.hpp"

struct bfp16ebs8 {};  // the tag type aie_api names (8-bit mantissas, one 8-bit exponent per 8 values)

namespace aie_host {

// bfp16ebs8 model (docs/aie-api-host.md, "Block float"): a block of 8 values shares the exponent E of its largest
// magnitude; each value keeps a signed 8-bit mantissa m = round(x / 2^(E-6)) in [-128, 127] (two's complement,
// one integer bit and six fraction bits relative to 2^E), rounded with the core's rounding mode (conv_even:
// nearest even, floor: toward -inf). A block holding inf/NaN becomes NaN. ASSUMPTION: AMD publishes no bit-level
// description; this is the MX-style int8 layout, documented as ours.
// returns the block's exponent e (values m * 2^(e-6)); kNoExp for an all-zero or non-finite block
constexpr int kNoExp = -1000;
inline int to_bfp16_block(const float *x, float *q) {
  float amax = 0.0f;
  bool finite = true;
  for (int i = 0; i < 8; ++i) {
    if (!std::isfinite(x[i])) finite = false;
    amax = std::fabs(x[i]) > amax ? std::fabs(x[i]) : amax;
  }
  if (!finite) {
    for (int i = 0; i < 8; ++i) q[i] = NAN;
    return kNoExp;
  }
  if (amax == 0.0f) {
    for (int i = 0; i < 8; ++i) q[i] = 0.0f;
    return kNoExp;
  }
  const int e = std::ilogb(amax);
  for (int i = 0; i < 8; ++i) {
    const double s = std::ldexp(static_cast<double>(x[i]), 6 - e);  // exact
    double m = rounding == aie::rounding_mode::floor ? std::floor(s) : std::nearbyint(s);  // nearbyint: ties even
    m = m > 127.0 ? 127.0 : (m < -128.0 ? -128.0 : m);
    q[i] = static_cast<float>(std::ldexp(m, e - 6));
  }
  return e;
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
  int e[N / 8];   // each block's exponent as converted (aie_host::kNoExp: unknown); a store writes it as E, as the
                  // hardware keeps the exponent it computed (a block rounded up to -128 * 2^(e-6) keeps e)
};

namespace detail_host {
template <unsigned N>
block_vector<bfp16ebs8, N> to_block_vector(const float *d) {  // accfloat -> bfp16ebs8, one conversion
  aie_host::count(aie_host::k_bfp16_convert);
  block_vector<bfp16ebs8, N> r;
  for (unsigned b = 0; b < N; b += 8) r.e[b / 8] = aie_host::to_bfp16_block(d + b, r.q + b);
  return r;
}
}  // namespace detail_host

// A v64bfp16ebs8 in memory: 72 bytes, per block of 8 values 9 bytes [E, m0 .. m7]: the biased exponent E = e + 127
// (value = m * 2^(E - 127 - 6)) then the 8 two's-complement mantissas. That is the layout of AMD's host converter
// for bfp16ebs8 operands (mlir-aie programming_examples/ml/block_datatypes/helper.h, floatToBfp16 with block 8),
// the bytes kernel_builder/block_float.py stores weights at rest in. One push is one 576-bit store, one pop one
// 576-bit load (counted as two 512-bit instructions and 72 bytes).
namespace detail_host {
constexpr unsigned kBfpBlockBytes = 72;

inline void encode_bfp(const float *q, const int *exps, unsigned char *out) {
  for (unsigned b = 0; b < 8; ++b) {
    float amax = 0.0f;
    for (unsigned i = 0; i < 8; ++i) amax = std::fabs(q[b * 8 + i]) > amax ? std::fabs(q[b * 8 + i]) : amax;
    // the block's exponent from its largest quantized magnitude; a block whose largest value is -128 * 2^(e-6) reads
    // as 2^(e+1): then the exponent one lower makes every mantissa an integer in [-128, 127] again
    int shift = amax == 0.0f ? 0 : std::ilogb(amax);
    const bool known = amax != 0.0f && exps[b] >= -127 && exps[b] <= 128;   // the exponent the conversion chose
    if (known) shift = exps[b];
    for (unsigned i = 0; !known && i < 8; ++i) {
      const float m = std::ldexp(q[b * 8 + i], 6 - shift);
      if (m != std::nearbyint(m) || m > 127.0f || m < -128.0f) {
        --shift;
        break;
      }
    }
    // E is 8 bits: the smallest exponent -127 (block_float.py raises it likewise; an all-zero block gets E = 0)
    if (shift < -127 || amax == 0.0f) shift = -127;
    out[b * 9] = static_cast<unsigned char>(shift + 127);
    for (unsigned i = 0; i < 8; ++i)   // mantissas m = q / 2^(e-6): exact integers in [-128, 127]
      out[b * 9 + 1 + i] =
          static_cast<unsigned char>(static_cast<signed char>(std::nearbyint(std::ldexp(q[b * 8 + i], 6 - shift))));
  }
}

inline void decode_bfp(const unsigned char *in, float *q, int *exps) {
  for (unsigned b = 0; b < 8; ++b) {
    const int e = static_cast<int>(in[b * 9]) - 127;   // the block's exponent; e - 6: the scale of the mantissas
    exps[b] = e;
    for (unsigned i = 0; i < 8; ++i)
      q[b * 8 + i] =
          std::ldexp(static_cast<float>(static_cast<signed char>(in[b * 9 + 1 + i])), e - 6);
  }
}
}  // namespace detail_host

template <typename T, unsigned N>
struct block_vector_output_buffer_stream {
  static_assert(std::is_same_v<T, bfp16ebs8> && N == 64, "aie_api_host: only v64bfp16ebs8 streams are modelled");
  explicit block_vector_output_buffer_stream(T *p) : ptr(reinterpret_cast<unsigned char *>(p)) {}
  void seek(int blocks) { ptr += blocks * static_cast<int>(detail_host::kBfpBlockBytes); }
  void push(const block_vector<T, N> &v) {
    aie_host::count(aie_host::k_vstore, 2);
    aie_host::count(aie_host::k_vstore_bytes, detail_host::kBfpBlockBytes);
    detail_host::encode_bfp(v.q, v.e, ptr);
    ptr += detail_host::kBfpBlockBytes;
  }
  block_vector_output_buffer_stream &operator<<(const block_vector<T, N> &v) {
    push(v);
    return *this;
  }

 private:
  unsigned char *ptr;
};

template <typename T, unsigned N>
struct block_vector_input_buffer_stream {
  static_assert(std::is_same_v<T, bfp16ebs8> && N == 64, "aie_api_host: only v64bfp16ebs8 streams are modelled");
  explicit block_vector_input_buffer_stream(const T *p) : ptr(reinterpret_cast<const unsigned char *>(p)) {}
  void seek(int blocks) { ptr += blocks * static_cast<int>(detail_host::kBfpBlockBytes); }
  block_vector<T, N> pop() {
    aie_host::count(aie_host::k_vload, 2);
    aie_host::count(aie_host::k_vload_bytes, detail_host::kBfpBlockBytes);
    block_vector<T, N> v;
    detail_host::decode_bfp(ptr, v.q, v.e);
    ptr += detail_host::kBfpBlockBytes;
    return v;
  }

 private:
  const unsigned char *ptr;
};

}  // namespace aie
