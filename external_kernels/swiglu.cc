// SwiGLU activation: y[i] = silu(gate[i]) * up[i], silu(g) = g / (1 + exp(-g)); f32 math, bf16 RNE output.
#include "kernel_common.h"

#if !defined(SWIGLU_N) || !defined(SWIGLU_SYMBOL)
#error "compile with -DSWIGLU_N=<elements> -DSWIGLU_SYMBOL=<name> (kernel_builder/externals.py)"
#endif
LLAMA_NPU_REQUIRE(SWIGLU_N);

#if defined(__AIENGINE__)

// sigmoid(g) = 1 / (1 + 2^(-g * log2e)): aie::exp2 (float in, bf16 out) and aie::inv (bf16) each carry bf16
// precision relative to their result, so sigmoid is within ~2 bf16 ulps for every g, and silu * up within ~4 of
// the f32 contract (the host path below is the contract). -g * log2e is formed from exact bf16 products of g and a
// bf16 pair (hi + lo) of log2e in f32, so large |g| keeps its exponent exact enough. (The earlier
// 0.5 + 0.5 * tanh(g/2) lost all relative precision for g << 0: 1 + tanh cancels; the host aie_api tests found it.)
// Only native bf16 x bf16 -> accfloat multiplies, 32 lanes per step.
static constexpr int kLanes = 32;
static_assert(SWIGLU_N % kLanes == 0, "SWIGLU_N must be a multiple of 32 on AIE2P");

extern "C" void SWIGLU_SYMBOL(bfloat16 *LLAMA_NPU_RESTRICT gate, bfloat16 *LLAMA_NPU_RESTRICT up,
                              bfloat16 *LLAMA_NPU_RESTRICT y) {
  ::aie::set_rounding(::aie::rounding_mode::conv_even);
  constexpr float kLog2e = 1.4426950408889634f;
  const bfloat16 nl_hi = static_cast<bfloat16>(-kLog2e);
  const bfloat16 nl_lo = static_cast<bfloat16>(-kLog2e - static_cast<float>(nl_hi));
  const ::aie::accum<accfloat, kLanes> one(::aie::broadcast<bfloat16, kLanes>(static_cast<bfloat16>(1.0f)));
  for (int i = 0; i < SWIGLU_N; i += kLanes) {
    ::aie::vector<bfloat16, kLanes> g = ::aie::load_v<kLanes>(gate + i);
    ::aie::vector<bfloat16, kLanes> u = ::aie::load_v<kLanes>(up + i);
    ::aie::accum<accfloat, kLanes> t = ::aie::mac(::aie::mul(g, nl_hi), g, nl_lo);  // -g * log2e
    ::aie::vector<bfloat16, kLanes> e = ::aie::exp2<bfloat16>(t.template to_vector<float>());
    ::aie::vector<bfloat16, kLanes> sig = ::aie::inv(::aie::add(one, e).template to_vector<bfloat16>());
    ::aie::accum<accfloat, kLanes> silu = ::aie::mul(g, sig);
    ::aie::accum<accfloat, kLanes> out = ::aie::mul(silu.template to_vector<bfloat16>(), u);
    ::aie::store_v(y + i, out.template to_vector<bfloat16>());
  }
}

#else

extern "C" void SWIGLU_SYMBOL(bfloat16 *LLAMA_NPU_RESTRICT gate, bfloat16 *LLAMA_NPU_RESTRICT up,
                              bfloat16 *LLAMA_NPU_RESTRICT y) {
  for (int i = 0; i < SWIGLU_N; ++i) {
    const float g = bf16_to_f32(gate[i]);
    const float silu = g / (1.0f + std::exp(-g));
    y[i] = f32_to_bf16(silu * bf16_to_f32(up[i]));
  }
}

#endif
