// 4-bit GEMV step: rows [row, row + Q4_TILE_M) of one herd tile's output, whole rows (K is never chunked):
//   y[row + m] = bf16_rne( sum_k w[m][k] * x[k] )   (f32 accumulation)
//   w[m][k] = bf16_rne( d[g] * q[k] + z[g] )  (Q4_MINS = 1: unsigned codes 0..15 and a per-group min z)
//   w[m][k] = bf16_rne( d[g] * q[k] )         (Q4_MINS = 0: signed codes -8..7), g = k / Q4_G
// w: Q4_TILE_M rows of Q4_RB bytes in the layout of kernel_builder/gemv_q4/format.py (docs/quantization.md):
// K/2 bytes of codes (element 2i in the low nibble of byte i), K/G bf16 scales, K/G bf16 mins (if any), padding
// to a multiple of 16 bytes. x[Q4_K] is the whole input vector (kept in L1), y[Q4_ROWS] the tile's output.
// With -DQ4_BITS=8 the codes are one byte each (int8 without mins: GGUF Q8_0), the same layout otherwise.
//
// Compiled once per (K, G, mins, tile_m, rows) with -DQ4_K -DQ4_G -DQ4_MINS -DQ4_TILE_M -DQ4_ROWS -DQ4_RB
// -DQ4_SYMBOL=mvq4_bf16_k<K>_g<G>_z<Z>_m<M>_r<R> (kernel_builder/gemv_q4/external.py).
// -DQ4_BIAS=1 (kernel_builder/gemv_q4_bias, mvq4b_...): x holds Q4_K + Q4_ROWS elements, the tile's bias rows b
// after the input, and y[row + m] = bf16_rne(sum + b[row + m]) (the f32 sum plus the bias, one rounding).
#include "kernel_common.h"

#if defined(Q4_BIAS) && Q4_BIAS
#define Q4_PLUS_BIAS(i) +bf16_to_f32(x[Q4_K + (i)])
#else
#define Q4_PLUS_BIAS(i)
#endif

#if !defined(Q4_K) || !defined(Q4_G) || !defined(Q4_MINS) || !defined(Q4_TILE_M) || !defined(Q4_ROWS) || \
    !defined(Q4_RB) || !defined(Q4_SYMBOL)
#error "compile with -DQ4_K -DQ4_G -DQ4_MINS -DQ4_TILE_M -DQ4_ROWS -DQ4_RB -DQ4_SYMBOL (gemv_q4/external.py)"
#endif
LLAMA_NPU_REQUIRE(Q4_K);
LLAMA_NPU_REQUIRE(Q4_G);
LLAMA_NPU_REQUIRE(Q4_TILE_M);
LLAMA_NPU_REQUIRE(Q4_ROWS);
LLAMA_NPU_REQUIRE(Q4_RB);
#ifndef Q4_BITS
#define Q4_BITS 4
#endif
static_assert(Q4_BITS == 4 || Q4_BITS == 8, "Q4_BITS is 4 or 8");
static_assert(Q4_K % Q4_G == 0, "Q4_G must divide Q4_K");
static_assert(Q4_ROWS % Q4_TILE_M == 0, "Q4_TILE_M must divide Q4_ROWS");
static_assert(Q4_RB % 16 == 0, "rows are padded to 16 bytes");
static_assert(Q4_RB >= Q4_K * Q4_BITS / 8 + 2 * (1 + Q4_MINS) * (Q4_K / Q4_G),
              "Q4_RB holds the codes, scales and mins");

static constexpr int kGroups = Q4_K / Q4_G;
static constexpr int kScaleOff = Q4_K * Q4_BITS / 8;       // bytes
static constexpr int kMinOff = kScaleOff + 2 * kGroups;    // bytes

#if defined(__AIENGINE__)

// One group of 32 codes is one 128-bit int4 vector; a group of 128 is four. Per 32 lanes: load, unpack to int8,
// to_float (exact), d * q (+ z) in accfloat, one RNE rounding to bf16, mac with x.
static constexpr int kLanes = 32;
static_assert(Q4_G % kLanes == 0, "Q4_G must be a multiple of 32 on AIE2P");
#if Q4_BITS == 8 && Q4_MINS
using code_t = uint8_t;
#elif Q4_BITS == 8
using code_t = int8_t;
#elif Q4_MINS
using code_t = uint4;
#else
using code_t = int4;
#endif

extern "C" void Q4_SYMBOL(uint8_t *LLAMA_NPU_RESTRICT w, bfloat16 *LLAMA_NPU_RESTRICT x,
                          bfloat16 *LLAMA_NPU_RESTRICT y, int32_t row) {
  ::aie::set_rounding(::aie::rounding_mode::conv_even);
  for (int m = 0; m < Q4_TILE_M; ++m) {
    const uint8_t *LLAMA_NPU_RESTRICT wr = w + m * Q4_RB;
    const bfloat16 *LLAMA_NPU_RESTRICT sc = reinterpret_cast<const bfloat16 *>(wr + kScaleOff);
    const bfloat16 *LLAMA_NPU_RESTRICT mn = reinterpret_cast<const bfloat16 *>(wr + kMinOff);
    ::aie::accum<accfloat, kLanes> a = ::aie::zeros<accfloat, kLanes>();
    for (int g = 0; g < kGroups; ++g) {
      const bfloat16 d = sc[g];
#if Q4_MINS
      const ::aie::vector<bfloat16, kLanes> z = ::aie::broadcast<bfloat16, kLanes>(mn[g]);
#endif
      for (int c = g * Q4_G; c < (g + 1) * Q4_G; c += kLanes) {
#if Q4_BITS == 8
        const auto q = ::aie::load_v<kLanes>(reinterpret_cast<const code_t *>(wr + c));
#else
        const auto q = ::aie::unpack(::aie::load_v<kLanes>(reinterpret_cast<const code_t *>(wr + c / 2)));
#endif
        ::aie::accum<accfloat, kLanes> t = ::aie::mul(::aie::to_float<bfloat16>(q), d);
#if Q4_MINS
        t = ::aie::add(t, z);
#endif
        a = ::aie::mac(a, t.template to_vector<bfloat16>(), ::aie::load_v<kLanes>(x + c));
      }
    }
    y[row + m] = static_cast<bfloat16>(::aie::reduce_add(a.template to_vector<float>()) Q4_PLUS_BIAS(row + m));
  }
}

#else  // host scalar path: the same dequantization, sequential f32 accumulation

static inline int code_at(const uint8_t *wr, int k) {
  if (Q4_BITS == 8) return Q4_MINS ? wr[k] : static_cast<int8_t>(wr[k]);
  const int nib = (wr[k / 2] >> (4 * (k % 2))) & 0xF;
  return Q4_MINS ? nib : (nib >= 8 ? nib - 16 : nib);
}

extern "C" void Q4_SYMBOL(uint8_t *LLAMA_NPU_RESTRICT w, bfloat16 *LLAMA_NPU_RESTRICT x,
                          bfloat16 *LLAMA_NPU_RESTRICT y, int32_t row) {
  for (int m = 0; m < Q4_TILE_M; ++m) {
    const uint8_t *wr = w + static_cast<long>(m) * Q4_RB;
    bfloat16 sc, mn{};
    float s = 0.0f;
    for (int k = 0; k < Q4_K; ++k) {
      const int g = k / Q4_G;
      std::memcpy(&sc, wr + kScaleOff + 2 * g, 2);
      float wk = bf16_to_f32(sc) * static_cast<float>(code_at(wr, k));
      if (Q4_MINS) {
        std::memcpy(&mn, wr + kMinOff + 2 * g, 2);
        wk += bf16_to_f32(mn);
      }
      s += bf16_to_f32(f32_to_bf16(wk)) * bf16_to_f32(x[k]);
    }
    y[row + m] = f32_to_bf16(s Q4_PLUS_BIAS(row + m));
  }
}

#endif

// -DQ4_SWIGLU_SYMBOL=mvq4a_bf16_... (kernel_builder/gemv_q4_swiglu, a decode's gate and up projections and their
// SwiGLU in one launch): the tile's Q4_ROWS outputs of the GEMV above hold its gate rows y[0, Q4_ROWS/2) and its
// up rows y[Q4_ROWS/2, Q4_ROWS); act[i] = silu(gate[i]) * up[i] for i < Q4_ROWS/2, by swiglu.cc's own code (the
// `swiglu` kernel's numerics, vector and host path alike), compiled into this object under a local name.
#if defined(Q4_SWIGLU_SYMBOL)
static_assert(Q4_ROWS % 2 == 0, "gate and up rows: Q4_ROWS is even");
#define SWIGLU_N (Q4_ROWS / 2)
#define SWIGLU_SYMBOL q4_swiglu_half
namespace q4_swiglu {   // swiglu.cc's constants stay apart from this file's
#include "swiglu.cc"
}  // namespace q4_swiglu
extern "C" void Q4_SWIGLU_SYMBOL(bfloat16 *LLAMA_NPU_RESTRICT y, bfloat16 *LLAMA_NPU_RESTRICT act) {
  q4_swiglu::SWIGLU_SYMBOL(y, y + SWIGLU_N, act);
}
#endif
