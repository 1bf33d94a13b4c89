// KV8 cache -> bf16 (kernel_builder/kv_dequant): KVD_ROWS KV8 rows (docs/quantization.md "KV cache": per kv head a
// block of K codes, V codes, K scale, V scale) -> the bf16 K and V rows, value = code * 2^-shift with shift read
// from the scale's exponent bits (exact in bf16). A prefill chunk attends over the cache dequantized this way.
// kv[KVD_ROWS][KVD_HEADS][2*KVD_HEAD_DIM + 8] int8 -> k[KVD_ROWS][W], v[KVD_ROWS][W] bf16, W = KVD_HEADS *
// KVD_HEAD_DIM. A block starts 8-byte aligned only: the code loads are unaligned ones.
#include "kernel_common.h"

#if !defined(KVD_ROWS) || !defined(KVD_HEADS) || !defined(KVD_HEAD_DIM) || !defined(KVD_SYMBOL)
#error "compile with -DKVD_ROWS -DKVD_HEADS -DKVD_HEAD_DIM -DKVD_SYMBOL (kernel_builder/kv_dequant/external.py)"
#endif
LLAMA_NPU_REQUIRE(KVD_ROWS);
LLAMA_NPU_REQUIRE(KVD_HEADS);
LLAMA_NPU_REQUIRE(KVD_HEAD_DIM);

static constexpr int kRows = KVD_ROWS, kHeads = KVD_HEADS, kHd = KVD_HEAD_DIM, kW = KVD_HEADS * KVD_HEAD_DIM;
static constexpr int kBlock = 2 * kHd + 8, kRow = kHeads * kBlock;

static inline int shift_at(const int8_t *scale) {   // 2^-shift = the f32 scale (its exponent bits)
  uint32_t b;
  __builtin_memcpy(&b, scale, 4);
  return 127 - static_cast<int>((b >> 23) & 0xffu);
}

#if defined(__AIENGINE__)

static constexpr int kLanes = 32;
static_assert(kHd % kLanes == 0, "KVD_HEAD_DIM must be a multiple of 32 on AIE2P");

extern "C" void KVD_SYMBOL(int8_t *LLAMA_NPU_RESTRICT kv, bfloat16 *LLAMA_NPU_RESTRICT k,
                           bfloat16 *LLAMA_NPU_RESTRICT v) {
  ::aie::set_rounding(::aie::rounding_mode::conv_even);
  for (int r = 0; r < kRows; ++r)
    for (int t = 0; t < 2; ++t) {
      bfloat16 *out = (t ? v : k) + r * kW;
      for (int h = 0; h < kHeads; ++h) {
        const int8_t *b = kv + r * kRow + h * kBlock;
        const int s = shift_at(b + 2 * kHd + 4 * t);
        for (int d = 0; d < kHd; d += kLanes)
          ::aie::store_v(out + h * kHd + d,
                         ::aie::to_float<bfloat16>(::aie::load_unaligned_v<kLanes>(b + t * kHd + d, 8), s));
      }
    }
}

#else  // host scalar path

extern "C" void KVD_SYMBOL(int8_t *LLAMA_NPU_RESTRICT kv, bfloat16 *LLAMA_NPU_RESTRICT k,
                           bfloat16 *LLAMA_NPU_RESTRICT v) {
  for (int r = 0; r < kRows; ++r)
    for (int t = 0; t < 2; ++t) {
      bfloat16 *out = (t ? v : k) + static_cast<long>(r) * kW;
      for (int h = 0; h < kHeads; ++h) {
        const int8_t *b = kv + static_cast<long>(r) * kRow + h * kBlock;
        const int s = shift_at(b + 2 * kHd + 4 * t);
        const int8_t *c = b + t * kHd;
        for (int d = 0; d < kHd; ++d) out[h * kHd + d] = f32_to_bf16(std::ldexp(static_cast<float>(c[d]), -s));
      }
    }
}

#endif
