// Host aie_api, part 1: element types, rounding, counters, errors. See docs/aie-api-host.md.
//
// Written for llama-npu from the public aie_api headers' documented behaviour (Xilinx/aie_api at dc3ab77,
// cited as `aie_api <file>:<line>`); no aie_api code is reproduced. Only what the kernels in
// external_kernels/*.cc use exists; any other type/shape is a compile error, a misaligned vector access a
// run-time error reported through aie_host_error() (the Python driver raises it after the call).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <type_traits>

#define AIE_HOST_HIDDEN __attribute__((visibility("hidden")))

namespace aie {
enum class rounding_mode { floor, ceil, positive_inf, negative_inf, symmetric_inf, symmetric_zero, conv_even,
                           conv_odd };
}

namespace aie_host {

// ------------------------------------------------------------------------------------------------ counters
// One counter per instruction kind (docs/aie-api-host.md, "Counts"). X-macro: name, meaning.
#define AIE_HOST_COUNT_KINDS(X)                                                                              \
  X(mmul_bfp16_8x8x8, "block-float 8x8x8 matrix MAC (also serves a 4x8x8 under the flag)")                 \
  X(mmul_bf16_4x8x8_emulated, "bf16 4x8x8 mmul emulated by 8 element-wise MACs")                            \
  X(vmac_bf16, "element-wise bf16 x bf16 -> f32 mul/mac/msc instruction (<= 64 lanes)")                     \
  X(vmul_f32_emulated, "element-wise f32 x f32 mul/mac/msc, one per 16 lanes (emulated with bf16 products)") \
  X(vadd_acc, "f32 accumulator add/sub instruction (<= 64 lanes)")                                           \
  X(vconvert, "accumulator <-> vector conversion (bf16 rounding, f32 move, bf16 widening)")                  \
  X(bfp16_convert, "accfloat -> bfp16ebs8 block conversion (64 lanes)")                                      \
  X(vload, "vector load instruction (one per 512 bits)")                                                       \
  X(vstore, "vector store instruction (one per 512 bits)")                                                     \
  X(vload_bytes, "bytes moved by vector loads")                                                              \
  X(vstore_bytes, "bytes moved by vector stores")                                                            \
  X(shuffle, "shuffle / transpose instruction")                                                              \
  X(broadcast, "broadcast of one element or one 128-bit group to a vector")                                  \
  X(vmax, "element-wise max")                                                                                \
  X(reduce_add, "reduce_add of one vector (a tree of adds in the unit)")                                     \
  X(reduce_max, "reduce_max of one vector")                                                                  \
  X(exp2, "exp2 of 16 lanes (f32 in, bf16 out)")                                                             \
  X(tanh, "tanh of 16 lanes (f32 in, bf16 out)")                                                             \
  X(inv, "vector reciprocal (bf16)")                                                                         \
  X(invsqrt_scalar, "scalar invsqrt")                                                                        \
  X(scalar_bf16_convert, "scalar float <-> bf16 conversion (runs on the vector unit)")                      \
  X(unpack, "int4 -> int8 lane widening (one per 512-bit result)")

enum Kind : int {
#define AIE_HOST_ENUM(name, doc) k_##name,
  AIE_HOST_COUNT_KINDS(AIE_HOST_ENUM)
#undef AIE_HOST_ENUM
      k_count
};

AIE_HOST_HIDDEN inline unsigned long long counts[k_count];
AIE_HOST_HIDDEN inline char error_text[512];
AIE_HOST_HIDDEN inline aie::rounding_mode rounding = aie::rounding_mode::floor;  // aie_api default: floor

inline void count(Kind k, unsigned long long n = 1) { counts[k] += n; }

// First error of a call wins; the driver reads it after the call and raises.
inline void fail(const char *msg) {
  if (error_text[0] == 0) std::snprintf(error_text, sizeof error_text, "%s", msg);
}

// ------------------------------------------------------------------------------------------- conversions
inline float bits_to_f32(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
inline uint32_t f32_to_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

// f32 -> bf16 bits under the core's rounding mode. The kernels select conv_even (round to nearest even); the
// default floor rounds toward -inf (aie_api aie.hpp:7811 set_rounding; a kernel that forgets it is visible).
inline uint16_t round_to_bf16(float f) {
  uint32_t u = f32_to_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);  // NaN stays NaN
  switch (rounding) {
    case aie::rounding_mode::conv_even:
      u += 0x7fffu + ((u >> 16) & 1u);
      break;
    case aie::rounding_mode::floor:  // toward -inf: drop bits of a positive, round a negative away
      if ((u & 0x80000000u) && (u & 0xffffu)) u += 0x10000u;
      break;
    default:
      fail("aie_api_host: only rounding_mode::conv_even and ::floor are modelled");
  }
  return static_cast<uint16_t>(u >> 16);
}

}  // namespace aie_host

// ------------------------------------------------------------------------------------------ element types
// bfloat16 is a compiler type on AIE2P; here a 2-byte class with the conversions the kernels use.
struct bfloat16 {
  uint16_t bits;
  bfloat16() = default;
  explicit bfloat16(float f) : bits(aie_host::round_to_bf16(f)) { aie_host::count(aie_host::k_scalar_bf16_convert); }
  operator float() const { return aie_host::bits_to_f32(static_cast<uint32_t>(bits) << 16); }
  static bfloat16 from_bits(uint16_t b) {
    bfloat16 r;
    r.bits = b;
    return r;
  }
};
static_assert(sizeof(bfloat16) == 2, "bfloat16 must be 2 bytes");

// accumulator tags (aie_api aie_types.hpp); accauto picks accfloat for bf16 x bf16 (aie2p/accum_native_types.hpp)
struct accfloat {};
struct accauto {};

namespace aie_host {
template <typename T>
inline constexpr bool is_elem_v = std::is_same_v<T, bfloat16> || std::is_same_v<T, float>;
// int8/uint8 lanes: the result of aie::unpack on int4/uint4 vectors (int4.hpp), converted by aie::to_float
template <typename T>
inline constexpr bool is_int8_lane_v = std::is_same_v<T, int8_t> || std::is_same_v<T, uint8_t>;
inline float widen(bfloat16 v) { return static_cast<float>(v); }
inline float widen(float v) { return v; }
template <typename T>
inline T narrow(float f) {
  if constexpr (std::is_same_v<T, float>)
    return f;
  else
    return bfloat16::from_bits(round_to_bf16(f));
}
}  // namespace aie_host

// The driver's view of the counters and the error. Defined (not inline) here: every kernel is its own shared
// library built from one translation unit (external_kernels/aie_host.py), so each has its own counters.
extern "C" {
__attribute__((visibility("default"))) int aie_host_kinds() { return aie_host::k_count; }
__attribute__((visibility("default"))) const char *aie_host_kind_name(int i) {
  static const char *names[] = {
#define AIE_HOST_NAME(name, doc) #name,
      AIE_HOST_COUNT_KINDS(AIE_HOST_NAME)
#undef AIE_HOST_NAME
  };
  return i >= 0 && i < aie_host::k_count ? names[i] : "";
}
__attribute__((visibility("default"))) unsigned long long aie_host_count(int i) {
  return i >= 0 && i < aie_host::k_count ? aie_host::counts[i] : 0;
}
__attribute__((visibility("default"))) const char *aie_host_error() { return aie_host::error_text; }
__attribute__((visibility("default"))) void aie_host_reset() {
  std::memset(aie_host::counts, 0, sizeof aie_host::counts);
  aie_host::error_text[0] = 0;
  aie_host::rounding = aie::rounding_mode::floor;  // each call starts like a fresh core: the kernel sets its mode
}
}
