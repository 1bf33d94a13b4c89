// SwiGLU activation: y[i] = silu(gate[i]) * up[i], silu(g) = g / (1 + exp(-g)); f32 math, bf16 RNE output.
#include "kernel_common.h"

#if !defined(SWIGLU_N) || !defined(SWIGLU_SYMBOL)
#error "compile with -DSWIGLU_N=<elements> -DSWIGLU_SYMBOL=<name> (kernel_builder/externals.py)"
#endif
LLAMA_NPU_REQUIRE(SWIGLU_N);

#if defined(__AIENGINE__)

// sigmoid(g) = 0.5 + 0.5*tanh(g/2): aie::tanh is the AIE2P transcendental with a float input and a bf16 result
// (~1 bf16 ulp). Only native bf16 x bf16 -> accfloat multiplies, 32 lanes per step; the sigmoid and silu are
// rounded to bf16 before their next product (each adds at most half an ulp), so the vector path is within ~2 bf16
// ulps of the f32 contract (the host path below is the contract).
static constexpr int kLanes = 32;
static_assert(SWIGLU_N % kLanes == 0, "SWIGLU_N must be a multiple of 32 on AIE2P");

extern "C" void SWIGLU_SYMBOL(bfloat16 *LLAMA_NPU_RESTRICT gate, bfloat16 *LLAMA_NPU_RESTRICT up,
                              bfloat16 *LLAMA_NPU_RESTRICT y) {
  ::aie::set_rounding(::aie::rounding_mode::conv_even);
  const bfloat16 half = static_cast<bfloat16>(0.5f);
  const ::aie::accum<accfloat, kLanes> half_acc(::aie::broadcast<bfloat16, kLanes>(half));
  for (int i = 0; i < SWIGLU_N; i += kLanes) {
    ::aie::vector<bfloat16, kLanes> g = ::aie::load_v<kLanes>(gate + i);
    ::aie::vector<bfloat16, kLanes> u = ::aie::load_v<kLanes>(up + i);
    ::aie::accum<accfloat, kLanes> g_half = ::aie::mul(g, half);  // exact
    ::aie::vector<bfloat16, kLanes> t = ::aie::tanh<bfloat16>(g_half.template to_vector<float>());
    ::aie::accum<accfloat, kLanes> sig = ::aie::mac(half_acc, t, half);  // 0.5 + 0.5*tanh(g/2)
    ::aie::accum<accfloat, kLanes> silu = ::aie::mul(g, sig.template to_vector<bfloat16>());
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
