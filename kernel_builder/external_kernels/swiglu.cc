// SwiGLU activation: y[i] = silu(gate[i]) * up[i], silu(g) = g / (1 + exp(-g)); f32 math, bf16 RNE output.
#include "kernel_common.h"

#if !defined(SWIGLU_N) || !defined(SWIGLU_SYMBOL)
#error "compile with -DSWIGLU_N=<elements> -DSWIGLU_SYMBOL=<name> (kernel_builder/externals.py)"
#endif
LLAMA_NPU_REQUIRE(SWIGLU_N);

#if defined(__AIENGINE__)

// sigmoid(g) = 0.5 + 0.5*tanh(g/2): aie::tanh is the AIE2P transcendental with a float input; its bf16
// result is the only place the vector path is less precise than the f32 contract (~1 bf16 ulp).
static constexpr int kLanes = 16;
static_assert(SWIGLU_N % kLanes == 0, "SWIGLU_N must be a multiple of 16 on AIE2P");

extern "C" void SWIGLU_SYMBOL(bfloat16 *LLAMA_NPU_RESTRICT gate, bfloat16 *LLAMA_NPU_RESTRICT up,
                              bfloat16 *LLAMA_NPU_RESTRICT y) {
  ::aie::set_rounding(::aie::rounding_mode::conv_even);
  const ::aie::vector<bfloat16, kLanes> half = ::aie::broadcast<bfloat16, kLanes>(static_cast<bfloat16>(0.5f));
  ::aie::accum<accfloat, kLanes> half_acc;
  half_acc.from_vector(::aie::broadcast<float, kLanes>(0.5f));
  for (int i = 0; i < SWIGLU_N; i += kLanes) {
    ::aie::vector<bfloat16, kLanes> g = ::aie::load_v<kLanes>(gate + i);
    ::aie::vector<bfloat16, kLanes> u = ::aie::load_v<kLanes>(up + i);
    ::aie::accum<accfloat, kLanes> g_half = ::aie::mul(g, half);  // exact
    ::aie::vector<bfloat16, kLanes> t = ::aie::tanh<bfloat16>(g_half.template to_vector<float>());
    ::aie::accum<accfloat, kLanes> sig = ::aie::mac(half_acc, t, half);  // 0.5 + 0.5*tanh(g/2)
    ::aie::accum<accfloat, kLanes> silu = ::aie::mul(g, sig.template to_vector<bfloat16>());
    ::aie::accum<accfloat, kLanes> u_acc;
    u_acc.from_vector(u);
    ::aie::accum<accfloat, kLanes> out =
        ::aie::mul(silu.template to_vector<float>(), u_acc.template to_vector<float>());
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
