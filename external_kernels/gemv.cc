// GEMV step: rows [row, row + GEMV_TILE_M) of one herd tile's output, K chunk [k0, k0 + GEMV_KC):
//   s[m] = (k0 == 0 ? 0 : acc[m]) + sum_c w[m][c] * x[k0 + c]     (f32)
//   k0 + GEMV_KC == GEMV_K (last chunk): y[row + m] = bf16_rne(s[m]), else acc[m] = s[m]
// w[GEMV_TILE_M][GEMV_KC] row-major (a [tile_m, kc] block of the HF [out, in] weight), x[GEMV_K] the whole input
// vector (received once per tile and kept in L1; the step reads its chunk at k0), acc[GEMV_TILE_M] an f32
// scratch carrying partial sums across K chunks, y[GEMV_ROWS] the tile's whole output (accumulated in L1, stored
// to L3 once by the caller).
//
// Compiled once per (K, KC, tile_m, rows) with -DGEMV_K -DGEMV_KC -DGEMV_TILE_M -DGEMV_ROWS
// -DGEMV_SYMBOL=mv_bf16_k<K>_c<KC>_m<M>_r<R> (kernel_builder/externals.py): the memref types of the call
// depend on all four, so each gets its own symbol and object.
// -DGEMV_BIAS=1 (kernel_builder/gemv_bias, symbol mvb_bf16_...): a bias epilogue. x holds GEMV_K + GEMV_ROWS
// elements: the input vector, then the tile's bias rows b (they arrive on x's stream, in x's one transfer), and
// the last chunk writes y[row + m] = bf16_rne(s[m] + b[row + m]): one rounding of the f32 sum plus the bias (a
// projection with its bias in one launch).
#include "kernel_common.h"

#if defined(GEMV_BIAS) && GEMV_BIAS
#define GEMV_PLUS_BIAS(i) +bf16_to_f32(x[GEMV_K + (i)])
#else
#define GEMV_PLUS_BIAS(i)
#endif

#if !defined(GEMV_K) || !defined(GEMV_KC) || !defined(GEMV_TILE_M) || !defined(GEMV_ROWS) || !defined(GEMV_SYMBOL)
#error "compile with -DGEMV_K -DGEMV_KC -DGEMV_TILE_M -DGEMV_ROWS -DGEMV_SYMBOL (kernel_builder/externals.py)"
#endif
LLAMA_NPU_REQUIRE(GEMV_K);
LLAMA_NPU_REQUIRE(GEMV_KC);
LLAMA_NPU_REQUIRE(GEMV_TILE_M);
LLAMA_NPU_REQUIRE(GEMV_ROWS);
static_assert(GEMV_K % GEMV_KC == 0, "GEMV_KC must divide GEMV_K");
static_assert(GEMV_ROWS % GEMV_TILE_M == 0, "GEMV_TILE_M must divide GEMV_ROWS");

#if defined(__AIENGINE__)

// 32 bf16 lanes per mac (bf16 x bf16 products are exact in the accfloat accumulator); two independent
// accumulators hide the mac latency when the chunk allows it.
static constexpr int kLanes = 32;
static_assert(GEMV_KC % kLanes == 0, "GEMV_KC must be a multiple of 32 on AIE2P");

extern "C" void GEMV_SYMBOL(bfloat16 *LLAMA_NPU_RESTRICT w, bfloat16 *LLAMA_NPU_RESTRICT x,
                            float *LLAMA_NPU_RESTRICT acc, bfloat16 *LLAMA_NPU_RESTRICT y, int32_t row,
                            int32_t k0) {
  ::aie::set_rounding(::aie::rounding_mode::conv_even);
  const bool first = k0 == 0;
  const bool last = k0 + GEMV_KC >= GEMV_K;
  const bfloat16 *LLAMA_NPU_RESTRICT xc = x + k0;
  for (int m = 0; m < GEMV_TILE_M; ++m) {
    const bfloat16 *LLAMA_NPU_RESTRICT wr = w + m * GEMV_KC;
    ::aie::accum<accfloat, kLanes> a0 = ::aie::zeros<accfloat, kLanes>();
    ::aie::accum<accfloat, kLanes> a1 = ::aie::zeros<accfloat, kLanes>();
    int c = 0;
    for (; c + 2 * kLanes <= GEMV_KC; c += 2 * kLanes) {
      a0 = ::aie::mac(a0, ::aie::load_v<kLanes>(wr + c), ::aie::load_v<kLanes>(xc + c));
      a1 = ::aie::mac(a1, ::aie::load_v<kLanes>(wr + c + kLanes), ::aie::load_v<kLanes>(xc + c + kLanes));
    }
    if (c < GEMV_KC) a0 = ::aie::mac(a0, ::aie::load_v<kLanes>(wr + c), ::aie::load_v<kLanes>(xc + c));
    float s = ::aie::reduce_add(::aie::add(a0, a1).template to_vector<float>());
    if (!first) s += acc[m];
    if (last)
      y[row + m] = static_cast<bfloat16>(s GEMV_PLUS_BIAS(row + m));
    else
      acc[m] = s;
  }
}

#else  // host scalar path: sequential f32 accumulation across the whole K (chunks continue the same sum)

extern "C" void GEMV_SYMBOL(bfloat16 *LLAMA_NPU_RESTRICT w, bfloat16 *LLAMA_NPU_RESTRICT x,
                            float *LLAMA_NPU_RESTRICT acc, bfloat16 *LLAMA_NPU_RESTRICT y, int32_t row,
                            int32_t k0) {
  const bool first = k0 == 0;
  const bool last = k0 + GEMV_KC >= GEMV_K;
  const bfloat16 *xc = x + k0;
  for (int m = 0; m < GEMV_TILE_M; ++m) {
    const bfloat16 *wr = w + static_cast<long>(m) * GEMV_KC;
    float s = first ? 0.0f : acc[m];
    for (int c = 0; c < GEMV_KC; ++c) s += bf16_to_f32(wr[c]) * bf16_to_f32(xc[c]);
    if (last)
      y[row + m] = f32_to_bf16(s GEMV_PLUS_BIAS(row + m));
    else
      acc[m] = s;
  }
}

#endif
