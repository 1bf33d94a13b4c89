// Shared prelude of the llama-npu external kernels.
//
// Two builds of every kernel source:
//  * AIE2P (Peano, --target=aie2p-none-unknown-elf): __AIENGINE__ is defined by the target, the aie_api
//    vector path is compiled and `bfloat16` is the AIE native type.
//  * host (g++/clang++, used by the tests): the portable scalar path; `bfloat16` below is a 16-bit storage
//    type with explicit conversions (bf16 -> f32 exact, f32 -> bf16 round-to-nearest-even), which is the
//    numerics contract of kernel_builder/reference.py.
#pragma once

#include <stdint.h>

#if defined(LLAMA_NPU_HOST) && defined(__AIENGINE__)
#error "LLAMA_NPU_HOST (host scalar build) must not be defined for the AIE target"
#endif

#if defined(__AIENGINE__)

#include <aie_api/aie.hpp>

#define LLAMA_NPU_RESTRICT __restrict

static inline float bf16_to_f32(bfloat16 v) { return static_cast<float>(v); }
static inline bfloat16 f32_to_bf16(float f) { return static_cast<bfloat16>(f); }

#else  // host scalar path

#include <cmath>
#include <cstring>

#define LLAMA_NPU_RESTRICT __restrict__

// Storage-only bf16 (the upper 16 bits of an IEEE binary32). Same size/layout as numpy/ml_dtypes bfloat16.
struct bfloat16 {
  uint16_t bits;
};
static_assert(sizeof(bfloat16) == 2, "bfloat16 must be 2 bytes");

static inline float bf16_to_f32(bfloat16 v) {
  uint32_t u = static_cast<uint32_t>(v.bits) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// Round-to-nearest-even; NaN stays NaN (quiet bit forced so truncation cannot turn it into inf).
static inline bfloat16 f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return bfloat16{static_cast<uint16_t>((u >> 16) | 0x0040u)};
  u += 0x7fffu + ((u >> 16) & 1u);
  return bfloat16{static_cast<uint16_t>(u >> 16)};
}

#endif

// Shape macros are mandatory: every object is compiled for one shape (see kernel_builder/externals.py).
#define LLAMA_NPU_REQUIRE(macro) static_assert((macro) > 0, #macro " must be a positive -D define")
