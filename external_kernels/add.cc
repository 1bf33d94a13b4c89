// Elementwise add of one L1 chunk: y[i] = bf16_rne(f32(a[i]) + f32(b[i])), i < ADD_N.
// Compiled once per chunk size with -DADD_N -DADD_SYMBOL=add_bf16_n<N> (kernel_builder/externals.py).
#include "kernel_common.h"

#if !defined(ADD_N) || !defined(ADD_SYMBOL)
#error "compile with -DADD_N=<elements> -DADD_SYMBOL=<name> (kernel_builder/externals.py)"
#endif
LLAMA_NPU_REQUIRE(ADD_N);

#if defined(__AIENGINE__)

// The sum is formed in an f32 accumulator (a widened, b added) and rounded once to bf16; 32 lanes per step.
static constexpr int kLanes = 32;
static_assert(ADD_N % kLanes == 0, "ADD_N must be a multiple of 32 on AIE2P");

extern "C" void ADD_SYMBOL(bfloat16 *LLAMA_NPU_RESTRICT a, bfloat16 *LLAMA_NPU_RESTRICT b,
                           bfloat16 *LLAMA_NPU_RESTRICT y) {
  ::aie::set_rounding(::aie::rounding_mode::conv_even);
  for (int i = 0; i < ADD_N; i += kLanes) {
    ::aie::accum<accfloat, kLanes> s(::aie::load_v<kLanes>(a + i));
    s = ::aie::add(s, ::aie::load_v<kLanes>(b + i));
    ::aie::store_v(y + i, s.template to_vector<bfloat16>());
  }
}

#else

extern "C" void ADD_SYMBOL(bfloat16 *LLAMA_NPU_RESTRICT a, bfloat16 *LLAMA_NPU_RESTRICT b,
                           bfloat16 *LLAMA_NPU_RESTRICT y) {
  for (int i = 0; i < ADD_N; ++i) y[i] = f32_to_bf16(bf16_to_f32(a[i]) + bf16_to_f32(b[i]));
}

#endif
