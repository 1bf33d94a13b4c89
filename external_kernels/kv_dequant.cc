// KV8 cache -> bf16 (kernel_builder/kv_dequant): KVD_ROWS KV8 rows (docs/quantization.md "KV cache": K codes, V
// codes, K scales, V scales per position) -> the bf16 K and V rows, value = code * 2^-shift with shift read from the
// scale's exponent bits (exact in bf16). A prefill chunk attends over the cache dequantized this way.
// codes[KVD_ROWS][2*W] int8 (a row's K then V codes), scales[KVD_ROWS][2*KVD_HEADS] f32 as bytes (K then V) ->
// k[KVD_ROWS][W], v[KVD_ROWS][W] bf16, W = KVD_HEADS * KVD_HEAD_DIM (the builder's DMAs split the KV8 rows).
#include "kernel_common.h"

#if !defined(KVD_ROWS) || !defined(KVD_HEADS) || !defined(KVD_HEAD_DIM) || !defined(KVD_SYMBOL)
#error "compile with -DKVD_ROWS -DKVD_HEADS -DKVD_HEAD_DIM -DKVD_SYMBOL (kernel_builder/kv_dequant/external.py)"
#endif
LLAMA_NPU_REQUIRE(KVD_ROWS);
LLAMA_NPU_REQUIRE(KVD_HEADS);
LLAMA_NPU_REQUIRE(KVD_HEAD_DIM);

static constexpr int kRows = KVD_ROWS, kHeads = KVD_HEADS, kHd = KVD_HEAD_DIM, kW = KVD_HEADS * KVD_HEAD_DIM;

static inline int shift_at(const int8_t *scale) {   // 2^-shift = the f32 scale (its exponent bits)
  uint32_t b;
  __builtin_memcpy(&b, scale, 4);
  return 127 - static_cast<int>((b >> 23) & 0xffu);
}

#if defined(__AIENGINE__)

static constexpr int kLanes = 32;
static_assert(kHd % kLanes == 0, "KVD_HEAD_DIM must be a multiple of 32 on AIE2P");

extern "C" void KVD_SYMBOL(int8_t *LLAMA_NPU_RESTRICT codes, int8_t *LLAMA_NPU_RESTRICT scales,
                           bfloat16 *LLAMA_NPU_RESTRICT k, bfloat16 *LLAMA_NPU_RESTRICT v) {
  ::aie::set_rounding(::aie::rounding_mode::conv_even);
  for (int r = 0; r < kRows; ++r)
    for (int t = 0; t < 2; ++t) {
      bfloat16 *out = (t ? v : k) + r * kW;
      for (int h = 0; h < kHeads; ++h) {
        const int s = shift_at(scales + 4 * (2 * r * kHeads + t * kHeads + h));
        const int8_t *c = codes + 2 * r * kW + t * kW + h * kHd;
        for (int d = 0; d < kHd; d += kLanes)
          ::aie::store_v(out + h * kHd + d, ::aie::to_float<bfloat16>(::aie::load_v<kLanes>(c + d), s));
      }
    }
}

#else  // host scalar path

extern "C" void KVD_SYMBOL(int8_t *LLAMA_NPU_RESTRICT codes, int8_t *LLAMA_NPU_RESTRICT scales,
                           bfloat16 *LLAMA_NPU_RESTRICT k, bfloat16 *LLAMA_NPU_RESTRICT v) {
  for (int r = 0; r < kRows; ++r)
    for (int t = 0; t < 2; ++t) {
      bfloat16 *out = (t ? v : k) + static_cast<long>(r) * kW;
      for (int h = 0; h < kHeads; ++h) {
        const int s = shift_at(scales + 4 * (2 * r * kHeads + t * kHeads + h));
        const int8_t *c = codes + 2L * r * kW + t * kW + h * kHd;
        for (int d = 0; d < kHd; ++d) out[h * kHd + d] = f32_to_bf16(std::ldexp(static_cast<float>(c[d]), -s));
      }
    }
}

#endif
