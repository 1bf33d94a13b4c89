// GEMV tile: y[GEMV_TILE_M] = w[GEMV_TILE_M][GEMV_K] (row-major) . x[GEMV_K]
// f32 accumulation, one bf16 round-to-nearest-even per output.
//
// Compiled once per (K, tile_m) with -DGEMV_K=.. -DGEMV_TILE_M=.. -DGEMV_SYMBOL=mv_bf16_k<K>_m<M>, so
// variants for different K (e.g. the 2048-wide projections and the 8192-wide down projection) coexist in one
// linked module.
#include "kernel_common.h"

#if !defined(GEMV_K) || !defined(GEMV_TILE_M) || !defined(GEMV_SYMBOL)
#error "compile with -DGEMV_K=<k> -DGEMV_TILE_M=<rows> -DGEMV_SYMBOL=<name> (kernel_builder/externals.py)"
#endif
LLAMA_NPU_REQUIRE(GEMV_K);
LLAMA_NPU_REQUIRE(GEMV_TILE_M);

#if defined(__AIENGINE__)

// 32 bf16 lanes per mac; two independent accumulators hide the mac latency when K allows it.
static constexpr int kLanes = 32;
static_assert(GEMV_K % kLanes == 0, "GEMV_K must be a multiple of 32 on AIE2P");

extern "C" void GEMV_SYMBOL(bfloat16 *LLAMA_NPU_RESTRICT w, bfloat16 *LLAMA_NPU_RESTRICT x,
                            bfloat16 *LLAMA_NPU_RESTRICT y) {
  ::aie::set_rounding(::aie::rounding_mode::conv_even);
  for (int m = 0; m < GEMV_TILE_M; ++m) {
    const bfloat16 *LLAMA_NPU_RESTRICT row = w + m * GEMV_K;
    ::aie::accum<accfloat, kLanes> acc0 = ::aie::zeros<accfloat, kLanes>();
    ::aie::accum<accfloat, kLanes> acc1 = ::aie::zeros<accfloat, kLanes>();
    int c = 0;
    for (; c + 2 * kLanes <= GEMV_K; c += 2 * kLanes) {
      acc0 = ::aie::mac(acc0, ::aie::load_v<kLanes>(row + c), ::aie::load_v<kLanes>(x + c));
      acc1 = ::aie::mac(acc1, ::aie::load_v<kLanes>(row + c + kLanes), ::aie::load_v<kLanes>(x + c + kLanes));
    }
    if (c < GEMV_K) acc0 = ::aie::mac(acc0, ::aie::load_v<kLanes>(row + c), ::aie::load_v<kLanes>(x + c));
    y[m] = static_cast<bfloat16>(::aie::reduce_add(::aie::add(acc0, acc1).template to_vector<float>()));
  }
}

#else  // host scalar path: sequential f32 accumulation

extern "C" void GEMV_SYMBOL(bfloat16 *LLAMA_NPU_RESTRICT w, bfloat16 *LLAMA_NPU_RESTRICT x,
                            bfloat16 *LLAMA_NPU_RESTRICT y) {
  for (int m = 0; m < GEMV_TILE_M; ++m) {
    const bfloat16 *row = w + static_cast<long>(m) * GEMV_K;
    float acc = 0.0f;
    for (int c = 0; c < GEMV_K; ++c) acc += bf16_to_f32(row[c]) * bf16_to_f32(x[c]);
    y[m] = f32_to_bf16(acc);
  }
}

#endif
