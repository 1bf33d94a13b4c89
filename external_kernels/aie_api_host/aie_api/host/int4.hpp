// Host aie_api, part 5: 4-bit integer vectors and their conversion to bf16, for the 4-bit GEMV
// (external_kernels/gemv_q4.cc). See docs/aie-api-host.md and docs/quantization.md.
//
//  * int4 / uint4 element types (aie_api types.hpp:84-95); AIE2P vectors of 32/64/128 lanes
//    (detail/aie2/vector_native_types.hpp:58-66): 128 bits is the smallest.
//  * load_v of an int4/uint4 vector: lane 2i is the low nibble of byte i, lane 2i+1 the high nibble (lane 0 in the
//    least significant bits, as every AIE vector register); the alignment rule of detail/ld_st.hpp:36-41 on the
//    vector's bytes (16 for 32 lanes, 32 for 64, 64 wider).
//  * unpack: int4 -> int8 (sign-extended), uint4 -> uint8 (zero-extended), same lane count
//    (aie.hpp:895; the next integer type, detail/utils.hpp:112-113); one `unpack` count per 512-bit result.
//  * to_float<bfloat16>(int8/uint8 vector): aie.hpp:7237, implemented for <= 16-bit lanes on AIE2P as an
//    accumulator move, an integer add of a magic constant, a float subtract and a conversion to bf16
//    (detail/aie2p/elementary.hpp:20-55): exact for |v| < 256; counted as 2 vconvert + 2 vadd_acc per
//    max(N, 32) lanes. Only bfloat16 results are modelled (the kernels use no other).
//  * to_fixed<int8_t>(bfloat16 vector, shift): aie.hpp to_fixed, detail/aie2p/elementary.hpp (Float2Fix): the
//    value times 2^shift through an accfloat add of a magic constant (round to nearest even, whatever the
//    rounding mode) and an integer move, saturated to [-128, 127]; counted like to_float (2 vconvert + 2
//    vadd_acc per max(N, 32) lanes). Only int8 results of bf16 lanes are modelled (the KV8 writer's op).
#pragma once

#include "vector.hpp"

struct int4_t {};
struct uint4_t {};
using int4 = int4_t;
using uint4 = uint4_t;

namespace aie {

namespace detail_host {
template <typename T>
inline constexpr bool is_nibble_v = std::is_same_v<T, int4_t> || std::is_same_v<T, uint4_t>;
template <typename T>
using nibble_lane_t = std::conditional_t<std::is_same_v<T, int4_t>, int8_t, uint8_t>;
}  // namespace detail_host

// 4-bit lanes, held unpacked on the host (one int8/uint8 per lane); 32, 64 or 128 lanes as on AIE2P.
template <unsigned N>
struct vector<int4_t, N> {
  static_assert(N == 32 || N == 64 || N == 128,
                "aie::vector<int4, N>: AIE2P int4 vectors have 32, 64 or 128 lanes (vector_native_types.hpp:58)");
  using value_type = int4_t;
  int8_t d[N];
  static constexpr unsigned size() { return N; }
};
template <unsigned N>
struct vector<uint4_t, N> {
  static_assert(N == 32 || N == 64 || N == 128,
                "aie::vector<uint4, N>: AIE2P uint4 vectors have 32, 64 or 128 lanes (vector_native_types.hpp:63)");
  using value_type = uint4_t;
  uint8_t d[N];
  static constexpr unsigned size() { return N; }
};

// load_v of 4-bit lanes from packed bytes (N/2 bytes; alignment on those bytes)
template <unsigned N, typename T>
  requires detail_host::is_nibble_v<std::remove_const_t<T>>
vector<std::remove_const_t<T>, N> load_v(T *p) {
  using U = std::remove_const_t<T>;
  constexpr unsigned bytes = N / 2;
  constexpr unsigned align = bytes == 16 ? 16 : bytes == 32 ? 32 : 64;
  vector<U, N> r{};
  aie_host::count(aie_host::k_vload, (bytes + 63) / 64);
  aie_host::count(aie_host::k_vload_bytes, bytes);
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  if (a % align) {
    char msg[200];
    std::snprintf(msg, sizeof msg,
                  "aie_api_host: misaligned load_v of %u x int4 at %p (offset %u bytes from a %u-byte boundary; "
                  "AIE2P needs %u-byte alignment for a %u-bit vector)",
                  N, static_cast<const void *>(p), static_cast<unsigned>(a % align), align, align, bytes * 8);
    aie_host::fail(msg);
    return r;
  }
  const uint8_t *b = reinterpret_cast<const uint8_t *>(p);
  for (unsigned i = 0; i < N; ++i) {
    const unsigned nib = (b[i / 2] >> (4 * (i % 2))) & 0xFu;
    if constexpr (std::is_same_v<U, int4_t>)
      r.d[i] = static_cast<int8_t>(nib >= 8 ? static_cast<int>(nib) - 16 : static_cast<int>(nib));
    else
      r.d[i] = static_cast<uint8_t>(nib);
  }
  return r;
}

// aie.hpp:895 unpack: the next integer type, same lanes
template <typename T, unsigned N>
  requires detail_host::is_nibble_v<T>
vector<detail_host::nibble_lane_t<T>, N> unpack(const vector<T, N> &v) {
  aie_host::count(aie_host::k_unpack, (N * 8 + 511) / 512);
  vector<detail_host::nibble_lane_t<T>, N> r;
  for (unsigned i = 0; i < N; ++i) r.d[i] = v.d[i];
  return r;
}

// aie.hpp:7237 to_float (int8/uint8 lanes -> bfloat16), detail/aie2p/elementary.hpp:20-55
template <typename TR, typename T, unsigned N>
  requires aie_host::is_int8_lane_v<T>
vector<TR, N> to_float(const vector<T, N> &v, int shift = 0) {
  static_assert(std::is_same_v<TR, bfloat16>, "aie_api_host: only to_float<bfloat16> of int8 lanes is modelled");
  constexpr unsigned ops = (N < 32 ? 32 : N) / 32;
  aie_host::count(aie_host::k_vconvert, 2 * ops);
  aie_host::count(aie_host::k_vadd_acc, 2 * ops);
  vector<TR, N> r;
  for (unsigned i = 0; i < N; ++i) r.d[i] = bfloat16::from_bits(aie_host::round_to_bf16(std::ldexp(float(v.d[i]), -shift)));
  return r;
}

// aie.hpp to_fixed (bfloat16 lanes -> int8), detail/aie2p/elementary.hpp Float2Fix: round(v * 2^shift), RNE,
// saturated
template <typename TR, typename T, unsigned N>
  requires std::is_same_v<T, bfloat16>
vector<TR, N> to_fixed(const vector<T, N> &v, int shift = 0) {
  static_assert(std::is_same_v<TR, int8_t>, "aie_api_host: only to_fixed<int8_t> of bfloat16 lanes is modelled");
  constexpr unsigned ops = (N < 32 ? 32 : N) / 32;
  aie_host::count(aie_host::k_vconvert, 2 * ops);
  aie_host::count(aie_host::k_vadd_acc, 2 * ops);
  vector<TR, N> r;
  for (unsigned i = 0; i < N; ++i) {
    const float x = std::nearbyint(std::ldexp(static_cast<float>(v.d[i]), shift));   // default mode: to even
    r.d[i] = static_cast<int8_t>(x > 127.0f ? 127 : (x < -128.0f ? -128 : static_cast<int>(x)));
  }
  return r;
}

}  // namespace aie
