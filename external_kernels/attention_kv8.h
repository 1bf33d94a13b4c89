// ATTN_MODE 3 of attention.cc: the decode step over the KV8 cache (kernel_builder/attention_kv8; the format:
// kernel_builder/kv_quant/reference.py, docs/quantization.md "KV cache"). Included by attention.cc on both paths.
// Item (int8): K codes [ATTN_LK][ATTN_HEAD_DIM], V codes [ATTN_LK][ATTN_HEAD_DIM], then per key j the f32 pair
// (K scale, V scale) at byte 2 * ATTN_LK * ATTN_HEAD_DIM + 8 j, then the ATTN_LQ query rows (bf16). A scale is
// 2^-shift: the dequantized value code * 2^-shift is exact in bf16.
#pragma once

static_assert((2 * kLk * kHd + 8 * kLk) % 64 == 0, "the query rows start 64-byte aligned");
static constexpr int kQ8 = 2 * kLk * kHd + 8 * kLk;   // byte offset of the query rows in an item

// shift of a power-of-two f32 scale 2^-shift from its bits
static inline int kv8_shift(const int8_t *scale) {
  uint32_t b;
  __builtin_memcpy(&b, scale, 4);
  return 127 - static_cast<int>((b >> 23) & 0xffu);
}

#if defined(__AIENGINE__)

extern "C" void ATTN_UPDATE_SYMBOL(int8_t *LLAMA_NPU_RESTRICT item, float *LLAMA_NPU_RESTRICT state, int32_t pos,
                                   int32_t k_pos0) {
  const bfloat16 *q = reinterpret_cast<const bfloat16 *>(item + kQ8);
  ::aie::set_rounding(::aie::rounding_mode::conv_even);
  const int vis = visible_keys(pos, k_pos0), first = first_key(pos, k_pos0);
  if (first >= vis) return;
  alignas(::aie::vector_decl_align) static bfloat16 kd[kLk * kHd], vd[kLk * kHd];
  const int8_t *kc = item, *vc = item + kLk * kHd, *sc = item + 2 * kLk * kHd;
  for (int j = first; j < vis; ++j) {   // the visible keys only: rows past the position may hold anything
    const int ks = kv8_shift(sc + 8 * j), vs = kv8_shift(sc + 8 * j + 4);
    for (int d = 0; d < kHd; d += kDotLanes) {
      ::aie::store_v(kd + j * kHd + d, ::aie::to_float<bfloat16>(::aie::load_v<kDotLanes>(kc + j * kHd + d), ks));
      ::aie::store_v(vd + j * kHd + d, ::aie::to_float<bfloat16>(::aie::load_v<kDotLanes>(vc + j * kHd + d), vs));
    }
  }
  decode_update(kd, vd, q, state, vis, first);
}

#else  // host scalar path

extern "C" void ATTN_UPDATE_SYMBOL(int8_t *LLAMA_NPU_RESTRICT item, float *LLAMA_NPU_RESTRICT state, int32_t pos,
                                   int32_t k_pos0) {
  const bfloat16 *q = reinterpret_cast<const bfloat16 *>(item + kQ8);
  static bfloat16 kd[kLk * kHd], vd[kLk * kHd];
  const int8_t *kc = item, *vc = item + kLk * kHd, *sc = item + 2 * kLk * kHd;
  const int vis = visible_keys(pos, k_pos0), first = first_key(pos, k_pos0);
  for (int j = first; j < vis; ++j) {
    const int ks = kv8_shift(sc + 8 * j), vs = kv8_shift(sc + 8 * j + 4);
    for (int d = 0; d < kHd; ++d) {
      kd[j * kHd + d] = f32_to_bf16(std::ldexp(static_cast<float>(kc[j * kHd + d]), -ks));
      vd[j * kHd + d] = f32_to_bf16(std::ldexp(static_cast<float>(vc[j * kHd + d]), -vs));
    }
  }
  update(kd, vd, q, state, pos, 0, k_pos0);
}

#endif
