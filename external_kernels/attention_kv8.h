// ATTN_MODE 3 of attention.cc: the decode step over the KV8 cache (kernel_builder/attention_kv8; the format:
// kernel_builder/kv_quant/reference.py, docs/quantization.md "KV cache"). Included by attention.cc on both paths.
// Item (int8): per key j one block of kBlock = 2 * ATTN_HEAD_DIM + 8 bytes (the cache's (position, kv head) block:
// K codes, V codes, K scale f32, V scale f32), then the ATTN_LQ query rows (bf16) at byte ATTN_LK * kBlock. A scale
// is 2^-shift: the dequantized value code * 2^-shift is exact in bf16. A block starts 8-byte aligned only, so the
// code loads are unaligned ones (one aligned load when the block happens to be 32-byte aligned).
#pragma once

static constexpr int kBlock = 2 * kHd + 8;           // bytes of one key's block
static constexpr int kQ8 = kLk * kBlock;              // byte offset of the query rows in an item
static_assert(kQ8 % 64 == 0, "the query rows start 64-byte aligned");

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
  for (int j = first; j < vis; ++j) {   // the visible keys only: rows past the position may hold anything
    const int8_t *b = item + j * kBlock;
    const int ks = kv8_shift(b + 2 * kHd), vs = kv8_shift(b + 2 * kHd + 4);
    for (int d = 0; d < kHd; d += kDotLanes) {
      ::aie::store_v(kd + j * kHd + d, ::aie::to_float<bfloat16>(::aie::load_unaligned_v<kDotLanes>(b + d, 8), ks));
      ::aie::store_v(vd + j * kHd + d,
                     ::aie::to_float<bfloat16>(::aie::load_unaligned_v<kDotLanes>(b + kHd + d, 8), vs));
    }
  }
  decode_update(kd, vd, q, state, vis, first);
}

#else  // host scalar path

extern "C" void ATTN_UPDATE_SYMBOL(int8_t *LLAMA_NPU_RESTRICT item, float *LLAMA_NPU_RESTRICT state, int32_t pos,
                                   int32_t k_pos0) {
  const bfloat16 *q = reinterpret_cast<const bfloat16 *>(item + kQ8);
  static bfloat16 kd[kLk * kHd], vd[kLk * kHd];
  const int vis = visible_keys(pos, k_pos0), first = first_key(pos, k_pos0);
  for (int j = first; j < vis; ++j) {
    const int8_t *b = item + static_cast<long>(j) * kBlock;
    const int ks = kv8_shift(b + 2 * kHd), vs = kv8_shift(b + 2 * kHd + 4);
    for (int d = 0; d < kHd; ++d) {
      kd[j * kHd + d] = f32_to_bf16(std::ldexp(static_cast<float>(b[d]), -ks));
      vd[j * kHd + d] = f32_to_bf16(std::ldexp(static_cast<float>(b[kHd + d]), -vs));
    }
  }
  update(kd, vd, q, state, pos, 0, k_pos0);
}

#endif
