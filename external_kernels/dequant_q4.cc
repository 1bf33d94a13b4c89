// Rows of 4-bit weights back to bf16 (the embedding row of a token, gathered from the 4-bit vocabulary matrix):
//   y[m][k] = bf16_rne( d[g] * q[k] + z[g] )  (DQ_MINS = 1: unsigned codes 0..15 and a per-group min z)
//   y[m][k] = bf16_rne( d[g] * q[k] )         (DQ_MINS = 0: signed codes -8..7), g = k / DQ_G
// w: DQ_ROWS rows of DQ_RB bytes in the q4 row layout (kernel_builder/gemv_q4/format.py, docs/quantization.md):
// the dequantization gemv_q4.cc applies to each weight before its mac, so both give the same bf16 weights.
// Compiled once per shape with -DDQ_K -DDQ_G -DDQ_MINS -DDQ_ROWS -DDQ_RB -DDQ_SYMBOL (kernel_builder/dequant_q4).
#include "kernel_common.h"

#if !defined(DQ_K) || !defined(DQ_G) || !defined(DQ_MINS) || !defined(DQ_ROWS) || !defined(DQ_RB) || \
    !defined(DQ_SYMBOL)
#error "compile with -DDQ_K -DDQ_G -DDQ_MINS -DDQ_ROWS -DDQ_RB -DDQ_SYMBOL (kernel_builder/dequant_q4)"
#endif
LLAMA_NPU_REQUIRE(DQ_K);
LLAMA_NPU_REQUIRE(DQ_G);
LLAMA_NPU_REQUIRE(DQ_ROWS);
LLAMA_NPU_REQUIRE(DQ_RB);
static_assert(DQ_K % DQ_G == 0, "DQ_G must divide DQ_K");
static_assert(DQ_RB % 16 == 0, "rows are padded to 16 bytes");
static_assert(DQ_RB >= DQ_K / 2 + 2 * (1 + DQ_MINS) * (DQ_K / DQ_G), "DQ_RB holds the codes, scales and mins");

static constexpr int kGroups = DQ_K / DQ_G;
static constexpr int kScaleOff = DQ_K / 2;                 // bytes
static constexpr int kMinOff = kScaleOff + 2 * kGroups;    // bytes

#if defined(__AIENGINE__)

// Per 32 codes (one 128-bit int4 vector): load, unpack, to_float (exact), d * q (+ z) in accfloat, one RNE
// rounding to bf16, store.
static constexpr int kLanes = 32;
static_assert(DQ_G % kLanes == 0, "DQ_G must be a multiple of 32 on AIE2P");
#if DQ_MINS
using code_t = uint4;
#else
using code_t = int4;
#endif

extern "C" void DQ_SYMBOL(uint8_t *LLAMA_NPU_RESTRICT w, bfloat16 *LLAMA_NPU_RESTRICT y) {
  ::aie::set_rounding(::aie::rounding_mode::conv_even);
  for (int m = 0; m < DQ_ROWS; ++m) {
    const uint8_t *LLAMA_NPU_RESTRICT wr = w + m * DQ_RB;
    const bfloat16 *LLAMA_NPU_RESTRICT sc = reinterpret_cast<const bfloat16 *>(wr + kScaleOff);
    const bfloat16 *LLAMA_NPU_RESTRICT mn = reinterpret_cast<const bfloat16 *>(wr + kMinOff);
    bfloat16 *LLAMA_NPU_RESTRICT yr = y + m * DQ_K;
    for (int g = 0; g < kGroups; ++g) {
      const bfloat16 d = sc[g];
#if DQ_MINS
      const ::aie::vector<bfloat16, kLanes> z = ::aie::broadcast<bfloat16, kLanes>(mn[g]);
#endif
      for (int c = g * DQ_G; c < (g + 1) * DQ_G; c += kLanes) {
        const auto q = ::aie::unpack(::aie::load_v<kLanes>(reinterpret_cast<const code_t *>(wr + c / 2)));
        ::aie::accum<accfloat, kLanes> t = ::aie::mul(::aie::to_float<bfloat16>(q), d);
#if DQ_MINS
        t = ::aie::add(t, z);
#endif
        ::aie::store_v(yr + c, t.template to_vector<bfloat16>());
      }
    }
  }
}

#else  // host scalar path: the same dequantization, element by element

static inline int code_at(const uint8_t *wr, int k) {
  const int nib = (wr[k / 2] >> (4 * (k % 2))) & 0xF;
  return DQ_MINS ? nib : (nib >= 8 ? nib - 16 : nib);
}

extern "C" void DQ_SYMBOL(uint8_t *LLAMA_NPU_RESTRICT w, bfloat16 *LLAMA_NPU_RESTRICT y) {
  for (int m = 0; m < DQ_ROWS; ++m) {
    const uint8_t *wr = w + static_cast<long>(m) * DQ_RB;
    bfloat16 sc, mn{};
    for (int k = 0; k < DQ_K; ++k) {
      const int g = k / DQ_G;
      std::memcpy(&sc, wr + kScaleOff + 2 * g, 2);
      float wk = bf16_to_f32(sc) * static_cast<float>(code_at(wr, k));
      if (DQ_MINS) {
        std::memcpy(&mn, wr + kMinOff + 2 * g, 2);
        wk += bf16_to_f32(mn);
      }
      y[static_cast<long>(m) * DQ_K + k] = f32_to_bf16(wk);
    }
  }
}

#endif
