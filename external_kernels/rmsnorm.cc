// RMSNorm of RMSNORM_UNITS consecutive groups of RMSNORM_GROUP elements (a group is a model row, or one head of
// a row for the per-head q/k norm), each with the same weight w[RMSNORM_GROUP]:
//   y = x * rsqrt(mean(x^2) + eps) * w      f32 math, one bf16 round-to-nearest-even per output.
// With -DRMSNORM_OFFSET=1 the weight is (1 + w), added in f32 (Gemma's RMSNorm stores w - 1).
// The mean multiplies by the compile-time constant 1/RMSNORM_GROUP: no division at run time (a scalar float
// division is soft-float on AIE2P and needs more than the default 1 KiB stack).
//
// Compiled once per (group, units) with -DRMSNORM_GROUP -DRMSNORM_UNITS -DRMSNORM_SYMBOL=rmsnorm_bf16_g<G>_u<U>
// (kernel_builder/externals.py); eps is a run-time f32 argument.
#include "kernel_common.h"

#if !defined(RMSNORM_GROUP) || !defined(RMSNORM_UNITS) || !defined(RMSNORM_SYMBOL)
#error "compile with -DRMSNORM_GROUP -DRMSNORM_UNITS -DRMSNORM_SYMBOL (kernel_builder/externals.py)"
#endif
LLAMA_NPU_REQUIRE(RMSNORM_GROUP);
LLAMA_NPU_REQUIRE(RMSNORM_UNITS);

static constexpr float kInvGroup = 1.0f / static_cast<float>(RMSNORM_GROUP);
#ifndef RMSNORM_OFFSET
#define RMSNORM_OFFSET 0
#endif
static_assert(RMSNORM_OFFSET == 0 || RMSNORM_OFFSET == 1, "RMSNORM_OFFSET must be 0 or 1");

#if defined(__AIENGINE__)

// 32 bf16 lanes: one native bf16 x bf16 -> accfloat multiply per 32 elements
static constexpr int kLanes = 32;
static_assert(RMSNORM_GROUP % kLanes == 0, "RMSNORM_GROUP must be a multiple of 32 on AIE2P");

extern "C" void RMSNORM_SYMBOL(bfloat16 *LLAMA_NPU_RESTRICT x, bfloat16 *LLAMA_NPU_RESTRICT w,
                               bfloat16 *LLAMA_NPU_RESTRICT y, float eps) {
  ::aie::set_rounding(::aie::rounding_mode::conv_even);
#if RMSNORM_OFFSET
  const ::aie::accum<accfloat, kLanes> one(::aie::broadcast<bfloat16, kLanes>(static_cast<bfloat16>(1.0f)));
#endif
  for (int u = 0; u < RMSNORM_UNITS; ++u) {
    const bfloat16 *LLAMA_NPU_RESTRICT xu = x + u * RMSNORM_GROUP;
    bfloat16 *LLAMA_NPU_RESTRICT yu = y + u * RMSNORM_GROUP;
    // sum of squares: bf16 x bf16 products are exact in the f32 accumulator
    ::aie::accum<accfloat, kLanes> sq = ::aie::zeros<accfloat, kLanes>();
    for (int i = 0; i < RMSNORM_GROUP; i += kLanes) {
      ::aie::vector<bfloat16, kLanes> v = ::aie::load_v<kLanes>(xu + i);
      sq = ::aie::mac(sq, v, v);
    }
    const float ms = ::aie::reduce_add(sq.template to_vector<float>()) * kInvGroup + eps;
    const float r = ::aie::invsqrt(ms);
    // r as an unevaluated bf16 pair (hi + lo) so that x*r and (x*r)*w are formed from exact bf16 products in
    // f32 accumulators: near-f32 accuracy with the native bf16 multipliers only.
    const bfloat16 r_hi = static_cast<bfloat16>(r);
    const bfloat16 r_lo = static_cast<bfloat16>(r - static_cast<float>(r_hi));
    for (int i = 0; i < RMSNORM_GROUP; i += kLanes) {
      ::aie::vector<bfloat16, kLanes> xv = ::aie::load_v<kLanes>(xu + i);
      ::aie::vector<bfloat16, kLanes> wv = ::aie::load_v<kLanes>(w + i);
      ::aie::accum<accfloat, kLanes> t = ::aie::mac(::aie::mul(xv, r_hi), xv, r_lo);  // x * r
      ::aie::vector<bfloat16, kLanes> t_hi = t.template to_vector<bfloat16>();
      ::aie::vector<bfloat16, kLanes> t_lo = ::aie::sub(t, t_hi).template to_vector<bfloat16>();
#if RMSNORM_OFFSET
      // (1 + w) exact in f32, then as a bf16 pair: (x * r) * (1 + w) from three exact bf16 products (a w of -1
      // gives exactly 0, as in f32)
      const ::aie::accum<accfloat, kLanes> w1 = ::aie::add(one, wv);
      const ::aie::vector<bfloat16, kLanes> w1_hi = w1.template to_vector<bfloat16>();
      const ::aie::vector<bfloat16, kLanes> w1_lo = ::aie::sub(w1, w1_hi).template to_vector<bfloat16>();
      ::aie::accum<accfloat, kLanes> out = ::aie::mac(::aie::mac(::aie::mul(t_hi, w1_hi), t_lo, w1_hi), t_hi, w1_lo);
#else
      ::aie::accum<accfloat, kLanes> out = ::aie::mac(::aie::mul(t_hi, wv), t_lo, wv);  // (x * r) * w
#endif
      ::aie::store_v(yu + i, out.template to_vector<bfloat16>());
    }
  }
}

#else  // host scalar path: the reference's f32 operations (sequential sum of squares)

extern "C" void RMSNORM_SYMBOL(bfloat16 *LLAMA_NPU_RESTRICT x, bfloat16 *LLAMA_NPU_RESTRICT w,
                               bfloat16 *LLAMA_NPU_RESTRICT y, float eps) {
  for (int u = 0; u < RMSNORM_UNITS; ++u) {
    const bfloat16 *xu = x + static_cast<long>(u) * RMSNORM_GROUP;
    bfloat16 *yu = y + static_cast<long>(u) * RMSNORM_GROUP;
    float ss = 0.0f;
    for (int i = 0; i < RMSNORM_GROUP; ++i) {
      const float v = bf16_to_f32(xu[i]);
      ss += v * v;
    }
    const float ms = ss * kInvGroup + eps;
    const float r = 1.0f / std::sqrt(ms);
    for (int i = 0; i < RMSNORM_GROUP; ++i) yu[i] = f32_to_bf16((bf16_to_f32(xu[i]) * r) * (bf16_to_f32(w[i]) + static_cast<float>(RMSNORM_OFFSET)));
  }
}

#endif
