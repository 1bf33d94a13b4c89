// SwiGLU activation: y[i] = silu(gate[i]) * up[i], silu(g) = g / (1 + exp(-g)); f32 math, bf16 RNE output.
#include "kernel_common.h"

#if !defined(SWIGLU_N) || !defined(SWIGLU_SYMBOL)
#error "compile with -DSWIGLU_N=<elements> -DSWIGLU_SYMBOL=<name> (kernel_builder/externals.py)"
#endif
LLAMA_NPU_REQUIRE(SWIGLU_N);

#if defined(__AIENGINE__)

// sigmoid(g) = 0.5 + 0.5*tanh(g/2): aie::tanh is the AIE2P transcendental with a float input; its bf16
// result is the only place the vector path is less precise than the f32 contract (~1 bf16 ulp). Only bf16 x
// bf16 products into f32 accumulators are used (native on AIE2P): silu = g * sigmoid stays in f32 as an
// unevaluated bf16 pair (hi + lo), so silu * up is rounded once.
static constexpr int kLanes = 16;
static_assert(SWIGLU_N % kLanes == 0, "SWIGLU_N must be a multiple of 16 on AIE2P");

extern "C" void SWIGLU_SYMBOL(bfloat16 *LLAMA_NPU_RESTRICT gate, bfloat16 *LLAMA_NPU_RESTRICT up,
                              bfloat16 *LLAMA_NPU_RESTRICT y) {
  ::aie::set_rounding(::aie::rounding_mode::conv_even);
  const bfloat16 half = static_cast<bfloat16>(0.5f);
  ::aie::accum<accfloat, kLanes> half_acc(::aie::broadcast<bfloat16, kLanes>(half));
  for (int i = 0; i < SWIGLU_N; i += kLanes) {
    ::aie::vector<bfloat16, kLanes> g = ::aie::load_v<kLanes>(gate + i);
    ::aie::vector<bfloat16, kLanes> u = ::aie::load_v<kLanes>(up + i);
    ::aie::accum<accfloat, kLanes> g_half = ::aie::mul(g, half);  // exact
    ::aie::vector<bfloat16, kLanes> t = ::aie::tanh<bfloat16>(g_half.template to_vector<float>());
    ::aie::accum<accfloat, kLanes> sig = ::aie::mac(half_acc, t, half);  // 0.5 + 0.5*tanh(g/2) in f32
    ::aie::vector<bfloat16, kLanes> sig_hi = sig.template to_vector<bfloat16>();
    ::aie::vector<bfloat16, kLanes> sig_lo = ::aie::sub(sig, sig_hi).template to_vector<bfloat16>();
    ::aie::accum<accfloat, kLanes> silu = ::aie::mac(::aie::mul(g, sig_hi), g, sig_lo);
    ::aie::vector<bfloat16, kLanes> s_hi = silu.template to_vector<bfloat16>();
    ::aie::vector<bfloat16, kLanes> s_lo = ::aie::sub(silu, s_hi).template to_vector<bfloat16>();
    ::aie::accum<accfloat, kLanes> out = ::aie::mac(::aie::mul(s_hi, u), s_lo, u);
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
