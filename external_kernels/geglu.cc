// GeGLU activation (Gemma): y[i] = gelu_tanh(gate[i]) * up[i] with the tanh-approximated GELU
//   gelu_tanh(g) = 0.5 * g * (1 + tanh(z)), z = c * (g + a * g^3), c = sqrt(2/pi), a = 0.044715
//                = g / (1 + exp(-2z))      (0.5 (1 + tanh z) = sigmoid(2z): no cancellation where tanh z ~ -1)
// f32 math, bf16 RNE output (kernel_builder/geglu/reference.py is the contract).
#include "kernel_common.h"

#if !defined(GEGLU_N) || !defined(GEGLU_SYMBOL)
#error "compile with -DGEGLU_N=<elements> -DGEGLU_SYMBOL=<name> (kernel_builder/externals.py)"
#endif
LLAMA_NPU_REQUIRE(GEGLU_N);

static constexpr float kC = 0.7978845608028654f;  // sqrt(2/pi)
static constexpr float kA = 0.044715f;

#if defined(__AIENGINE__)

// 0.5 * (1 + tanh(z)) = sigmoid(2z) = 1 / (1 + 2^(-2z * log2e)), so gelu_tanh(g) = g * sigmoid(2z) and the
// exp2 argument is t = g * (p + q * g^2) with p = -2c*log2e, q = -2ca*log2e (one f32 constant each). As in
// swiglu.cc: only native bf16 x bf16 -> accfloat multiplies; f32 values that feed a product are split into a
// bf16 pair (hi + lo) so the products are near-f32; aie::exp2 (bf16 out) and aie::inv (bf16) carry bf16
// precision, so the result is within a few bf16 ulps of the f32 contract. 32 lanes per step.
static constexpr int kLanes = 32;
static_assert(GEGLU_N % kLanes == 0, "GEGLU_N must be a multiple of 32 on AIE2P");

using Vb = ::aie::vector<bfloat16, kLanes>;
using Acc = ::aie::accum<accfloat, kLanes>;

static inline bfloat16 hi_of(float x) { return static_cast<bfloat16>(x); }
static inline bfloat16 lo_of(float x) { return static_cast<bfloat16>(x - static_cast<float>(static_cast<bfloat16>(x))); }

extern "C" void GEGLU_SYMBOL(bfloat16 *LLAMA_NPU_RESTRICT gate, bfloat16 *LLAMA_NPU_RESTRICT up,
                             bfloat16 *LLAMA_NPU_RESTRICT y) {
  ::aie::set_rounding(::aie::rounding_mode::conv_even);
  constexpr float kLog2e = 1.4426950408889634f;
  constexpr float kP = -2.0f * kC * kLog2e;
  constexpr float kQ = -2.0f * kC * kA * kLog2e;
  const bfloat16 q_hi = hi_of(kQ), q_lo = lo_of(kQ);
  const Acc p_acc(::aie::broadcast<float, kLanes>(kP));
  const Acc one(::aie::broadcast<bfloat16, kLanes>(static_cast<bfloat16>(1.0f)));
  for (int i = 0; i < GEGLU_N; i += kLanes) {
    const Vb g = ::aie::load_v<kLanes>(gate + i);
    const Vb u = ::aie::load_v<kLanes>(up + i);
    const Acc g2 = ::aie::mul(g, g);                                   // exact in f32
    const Vb g2_hi = g2.template to_vector<bfloat16>();
    const Vb g2_lo = ::aie::sub(g2, g2_hi).template to_vector<bfloat16>();
    // inner = p + q * g^2 (q and g^2 as bf16 pairs; the lo x lo term is below f32 precision)
    Acc inner = ::aie::mac(::aie::mac(::aie::mac(p_acc, g2_hi, q_hi), g2_lo, q_hi), g2_hi, q_lo);
    const Vb in_hi = inner.template to_vector<bfloat16>();
    const Vb in_lo = ::aie::sub(inner, in_hi).template to_vector<bfloat16>();
    const Acc t = ::aie::mac(::aie::mul(g, in_hi), g, in_lo);         // -2z * log2e
    const Vb e = ::aie::exp2<bfloat16>(t.template to_vector<float>());
    const Vb sig = ::aie::inv(::aie::add(one, e).template to_vector<bfloat16>());
    const Acc gelu = ::aie::mul(g, sig);
    const Acc out = ::aie::mul(gelu.template to_vector<bfloat16>(), u);
    ::aie::store_v(y + i, out.template to_vector<bfloat16>());
  }
}

#else  // host scalar path: the reference's f32 operations

extern "C" void GEGLU_SYMBOL(bfloat16 *LLAMA_NPU_RESTRICT gate, bfloat16 *LLAMA_NPU_RESTRICT up,
                             bfloat16 *LLAMA_NPU_RESTRICT y) {
  for (int i = 0; i < GEGLU_N; ++i) {
    const float g = bf16_to_f32(gate[i]);
    const float gelu = g / (1.0f + std::exp(-2.0f * kC * (g + kA * g * g * g)));
    y[i] = f32_to_bf16(gelu * bf16_to_f32(up[i]));
  }
}

#endif
