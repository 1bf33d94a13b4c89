// 4-bit -> bf16 dequantization of whole rows (the prefill GEMMs' weight, one layer at a time into a scratch):
//   y[m][k] = bf16_rne( d[g] * q[k] + z[g] )  (DQ4_MINS = 1: unsigned codes 0..15 and a per-group min z)
//   y[m][k] = bf16_rne( d[g] * q[k] )         (DQ4_MINS = 0: signed codes -8..7), g = k / DQ4_G
// exactly the weight gemv_q4.cc multiplies (the same f32 ops, one RNE rounding). w: DQ4_TILE_M rows of DQ4_RB
// bytes in the layout of kernel_builder/gemv_q4/format.py (docs/quantization.md); y: DQ4_TILE_M rows of DQ4_K.
//
// Compiled once per (K, G, mins, tile_m) with -DDQ4_K -DDQ4_G -DDQ4_MINS -DDQ4_TILE_M -DDQ4_RB
// -DDQ4_SYMBOL=dqq4_bf16_k<K>_g<G>_z<Z>_m<M> (kernel_builder/dequant_q4/external.py).
#include "kernel_common.h"

#if !defined(DQ4_K) || !defined(DQ4_G) || !defined(DQ4_MINS) || !defined(DQ4_TILE_M) || !defined(DQ4_RB) || \
    !defined(DQ4_SYMBOL)
#error "compile with -DDQ4_K -DDQ4_G -DDQ4_MINS -DDQ4_TILE_M -DDQ4_RB -DDQ4_SYMBOL (dequant_q4/external.py)"
#endif
LLAMA_NPU_REQUIRE(DQ4_K);
LLAMA_NPU_REQUIRE(DQ4_G);
LLAMA_NPU_REQUIRE(DQ4_TILE_M);
LLAMA_NPU_REQUIRE(DQ4_RB);
static_assert(DQ4_K % DQ4_G == 0, "DQ4_G must divide DQ4_K");
static_assert(DQ4_RB % 16 == 0, "rows are padded to 16 bytes");
static_assert(DQ4_RB >= DQ4_K / 2 + 2 * (1 + DQ4_MINS) * (DQ4_K / DQ4_G), "DQ4_RB holds the codes, scales, mins");

static constexpr int kGroups = DQ4_K / DQ4_G;
static constexpr int kScaleOff = DQ4_K / 2;                // bytes
static constexpr int kMinOff = kScaleOff + 2 * kGroups;    // bytes

#if defined(__AIENGINE__)

// Per 32 lanes (one 128-bit int4 vector): load, unpack to int8, to_float (exact), d * q (+ z) in accfloat, one
// RNE rounding to bf16, store.
static constexpr int kLanes = 32;
static_assert(DQ4_G % kLanes == 0, "DQ4_G must be a multiple of 32 on AIE2P");
#if DQ4_MINS
using code_t = uint4;
#else
using code_t = int4;
#endif

extern "C" void DQ4_SYMBOL(uint8_t *LLAMA_NPU_RESTRICT w, bfloat16 *LLAMA_NPU_RESTRICT y) {
  ::aie::set_rounding(::aie::rounding_mode::conv_even);
  for (int m = 0; m < DQ4_TILE_M; ++m) {
    const uint8_t *LLAMA_NPU_RESTRICT wr = w + m * DQ4_RB;
    bfloat16 *LLAMA_NPU_RESTRICT yr = y + m * DQ4_K;
    const bfloat16 *LLAMA_NPU_RESTRICT sc = reinterpret_cast<const bfloat16 *>(wr + kScaleOff);
    const bfloat16 *LLAMA_NPU_RESTRICT mn = reinterpret_cast<const bfloat16 *>(wr + kMinOff);
    for (int g = 0; g < kGroups; ++g) {
      const bfloat16 d = sc[g];
#if DQ4_MINS
      const ::aie::vector<bfloat16, kLanes> z = ::aie::broadcast<bfloat16, kLanes>(mn[g]);
#endif
      for (int c = g * DQ4_G; c < (g + 1) * DQ4_G; c += kLanes) {
        const auto q = ::aie::unpack(::aie::load_v<kLanes>(reinterpret_cast<const code_t *>(wr + c / 2)));
        ::aie::accum<accfloat, kLanes> t = ::aie::mul(::aie::to_float<bfloat16>(q), d);
#if DQ4_MINS
        t = ::aie::add(t, z);
#endif
        ::aie::store_v(yr + c, t.template to_vector<bfloat16>());
      }
    }
  }
}

#else  // host scalar path: the same dequantization, element by element

extern "C" void DQ4_SYMBOL(uint8_t *LLAMA_NPU_RESTRICT w, bfloat16 *LLAMA_NPU_RESTRICT y) {
  for (int m = 0; m < DQ4_TILE_M; ++m) {
    const uint8_t *wr = w + static_cast<long>(m) * DQ4_RB;
    for (int k = 0; k < DQ4_K; ++k) {
      const int g = k / DQ4_G;
      const int nib = (wr[k / 2] >> (4 * (k % 2))) & 0xF;
      const int q = DQ4_MINS ? nib : (nib >= 8 ? nib - 16 : nib);
      bfloat16 sc, mn{};
      std::memcpy(&sc, wr + kScaleOff + 2 * g, 2);
      float v = bf16_to_f32(sc) * static_cast<float>(q);
      if (DQ4_MINS) {
        std::memcpy(&mn, wr + kMinOff + 2 * g, 2);
        v += bf16_to_f32(mn);
      }
      y[static_cast<long>(m) * DQ4_K + k] = f32_to_bf16(v);
    }
  }
}

#endif
