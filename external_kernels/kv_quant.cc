// KV8 cache writer (kernel_builder/kv_quant): KVQ_ROWS rows of KVQ_HEADS heads x KVQ_HEAD_DIM bf16 values (K or V
// after RoPE) -> int8 codes and one f32 scale per (row, head), docs/quantization.md "KV cache":
//   e = exponent of amax = max |x| over the head's values (amax = m * 2^e, 1 <= m < 2), shift = 6 - e (clamped to
//   [KVQ_MIN_SHIFT, KVQ_MAX_SHIFT]); code = round_half_even(x * 2^shift) saturated to [-128, 127];
//   scale = 2^-shift (a power of two: code * scale is exact in bf16, so the cache dequantizes exactly to bf16).
//   amax == 0: shift 0, codes 0, scale 1.
// x[KVQ_ROWS][KVQ_HEADS * KVQ_HEAD_DIM] bf16 -> codes[KVQ_ROWS][KVQ_HEADS * KVQ_HEAD_DIM] int8,
// scales[KVQ_ROWS][KVQ_HEADS] f32 as bytes (the builder's DMAs put codes and scales at the K or V half of the
// cache's KV8 rows).
#include "kernel_common.h"

#if !defined(KVQ_ROWS) || !defined(KVQ_HEADS) || !defined(KVQ_HEAD_DIM) || !defined(KVQ_SYMBOL)
#error "compile with -DKVQ_ROWS -DKVQ_HEADS -DKVQ_HEAD_DIM -DKVQ_SYMBOL (kernel_builder/kv_quant/external.py)"
#endif
LLAMA_NPU_REQUIRE(KVQ_ROWS);
LLAMA_NPU_REQUIRE(KVQ_HEADS);
LLAMA_NPU_REQUIRE(KVQ_HEAD_DIM);

static constexpr int kRows = KVQ_ROWS, kHeads = KVQ_HEADS, kHd = KVQ_HEAD_DIM, kWidth = KVQ_HEADS * KVQ_HEAD_DIM;
static constexpr int kMinShift = -64, kMaxShift = 100;   // the shifts AIE2P's float<->fixed magic numbers admit

// shift of a head from the bits of its amax (f32): 6 - unbiased exponent, clamped; 0 for amax == 0
static inline int shift_of(uint32_t amax_bits) {
  if ((amax_bits & 0x7fffffffu) == 0) return 0;
  const int s = 6 - (static_cast<int>((amax_bits >> 23) & 0xffu) - 127);
  return s < kMinShift ? kMinShift : (s > kMaxShift ? kMaxShift : s);
}
static inline float pow2_neg(int shift) {   // 2^-shift as f32 bits (normal for the clamped range)
  const uint32_t b = static_cast<uint32_t>(127 - shift) << 23;
  float f;
  __builtin_memcpy(&f, &b, 4);
  return f;
}

#if defined(__AIENGINE__)

static constexpr int kLanes = 32;
static_assert(kHd % kLanes == 0, "KVQ_HEAD_DIM must be a multiple of 32 on AIE2P");

extern "C" void KVQ_SYMBOL(bfloat16 *LLAMA_NPU_RESTRICT x, int8_t *LLAMA_NPU_RESTRICT codes,
                           int8_t *LLAMA_NPU_RESTRICT scales) {
  ::aie::set_rounding(::aie::rounding_mode::conv_even);
  for (int r = 0; r < kRows; ++r)
    for (int h = 0; h < kHeads; ++h) {
      const bfloat16 *xh = x + r * kWidth + h * kHd;
      // amax: max(x, -x) over the head, as f32 (16 lanes at a time: the f32 max and reduce)
      ::aie::vector<float, 16> vmax = ::aie::zeros<float, 16>();
      for (int d = 0; d < kHd; d += 16) {
        ::aie::accum<accfloat, 16> a;
        a.from_vector(::aie::load_v<16>(xh + d));
        const ::aie::vector<float, 16> f = a.template to_vector<float>();
        const ::aie::vector<float, 16> n = ::aie::mul(f, -1.0f).template to_vector<float>();
        vmax = ::aie::max(vmax, ::aie::max(f, n));
      }
      const float amax = ::aie::reduce_max(vmax);
      const int s = shift_of(__builtin_bit_cast(uint32_t, amax));
      for (int d = 0; d < kHd; d += kLanes)
        ::aie::store_v(codes + r * kWidth + h * kHd + d, ::aie::to_fixed<int8_t>(::aie::load_v<kLanes>(xh + d), s));
      const float sc = pow2_neg(s);
      __builtin_memcpy(scales + 4 * (r * kHeads + h), &sc, 4);
    }
}

#else  // host scalar path: the same rule, one value at a time

extern "C" void KVQ_SYMBOL(bfloat16 *LLAMA_NPU_RESTRICT x, int8_t *LLAMA_NPU_RESTRICT codes,
                           int8_t *LLAMA_NPU_RESTRICT scales) {
  for (int r = 0; r < kRows; ++r)
    for (int h = 0; h < kHeads; ++h) {
      const bfloat16 *xh = x + static_cast<long>(r) * kWidth + h * kHd;
      float amax = 0.0f;
      for (int d = 0; d < kHd; ++d) amax = std::fabs(bf16_to_f32(xh[d])) > amax ? std::fabs(bf16_to_f32(xh[d])) : amax;
      uint32_t bits;
      std::memcpy(&bits, &amax, 4);
      const int s = shift_of(bits);
      for (int d = 0; d < kHd; ++d) {
        float c = std::nearbyint(std::ldexp(bf16_to_f32(xh[d]), s));
        c = c > 127.0f ? 127.0f : (c < -128.0f ? -128.0f : c);
        codes[static_cast<long>(r) * kWidth + h * kHd + d] = static_cast<int8_t>(c);
      }
      const float sc = pow2_neg(s);
      __builtin_memcpy(scales + 4 * (r * kHeads + h), &sc, 4);
    }
}

#endif
