// GEMV step on weights at rest in block float (bfp16ebs8, kernel_builder/block_float.py): rows [row, row + TILE_M)
// of one herd tile's output, K chunk [k0, k0 + KC):
//   s[m] = (k0 == 0 ? 0 : acc[m]) + sum over the K blocks kb of the chunk, in ascending order, of
//          dot(bfp16(x[8kb .. 8kb+7]), w[m][8kb .. 8kb+7])          (each 8-term dot exact, one f32 rounding per add)
//   k0 + KC == K (last chunk): y[row + m] = bf16_rne(s[m] (+ b[row + m])), else acc[m] = s[m]
// w: TILE_M/8 block rows of the at-rest layout, each the K chunk of one block row: KC/8 blocks of 72 bytes, block
// row r at byte r * KC/8 * 72 (a block is 8 rows x [E, m0 .. m7]: rows along n, values along k, AMD's bfp16ebs8
// sub-tile layout). x[K] the whole input vector in bf16 (kept in L1 for all steps), acc[TILE_M] an f32 scratch
// carrying partial sums across K chunks, y[ROWS] the tile's whole output (stored to L3 once by the caller).
// bfp16(x): x rounded to block float per 8 values as the matrix unit requires (kernel_builder.numerics.
// to_bfp16ebs8: shared exponent of the largest magnitude, 8-bit mantissas, round half to even).
//
// Compiled once per (K, KC, tile_m, rows) with -DGBFP_K -DGBFP_KC -DGBFP_TILE_M -DGBFP_ROWS
// -DGBFP_SYMBOL=mvbfp_bf16_k<K>_c<KC>_m<M>_r<R> (kernel_builder/gemv_bfp/external.py).
// -DGBFP_BIAS=1 (kernel_builder/gemv_bfp_bias, mvbfpb_bf16_...): x holds K + ROWS elements, the tile's bias rows b
// after the input (they arrive in x's one transfer), and the last chunk adds b[row + m] to the f32 sum before the
// one rounding.
#include "kernel_common.h"

#if !defined(GBFP_K) || !defined(GBFP_KC) || !defined(GBFP_TILE_M) || !defined(GBFP_ROWS) || !defined(GBFP_SYMBOL)
#error "compile with -DGBFP_K -DGBFP_KC -DGBFP_TILE_M -DGBFP_ROWS -DGBFP_SYMBOL (kernel_builder/gemv_bfp/external.py)"
#endif
LLAMA_NPU_REQUIRE(GBFP_K);
LLAMA_NPU_REQUIRE(GBFP_KC);
LLAMA_NPU_REQUIRE(GBFP_TILE_M);
LLAMA_NPU_REQUIRE(GBFP_ROWS);
#ifndef GBFP_BIAS
#define GBFP_BIAS 0
#endif
static_assert(GBFP_K % GBFP_KC == 0, "GBFP_KC must divide GBFP_K");
static_assert(GBFP_KC % 8 == 0 && GBFP_TILE_M % 8 == 0, "whole 8x8 blocks: GBFP_KC and GBFP_TILE_M are multiples of 8");
static_assert(GBFP_ROWS % GBFP_TILE_M == 0, "GBFP_TILE_M must divide GBFP_ROWS");

static constexpr int kBlk = 8;                          // block edge
static constexpr int kBlkBytes = 72;                    // one v64bfp16ebs8: 8 x [E, m0 .. m7]
static constexpr int kKB = GBFP_KC / kBlk;              // K blocks per call
static constexpr int kNB = GBFP_TILE_M / kBlk;          // block rows per call
static constexpr int kRowBytes = kKB * kBlkBytes;       // bytes of one block row's K chunk

#if defined(__AIENGINE__)

// AIE2P has no bfp16 -> bf16 unpack; its block-float matrix instruction mac_8x8_8x8T (aie::mmul<8, 8, 8, bfp16ebs8,
// bfp16ebs8>, aie_api aie2p/mmul_bfp16_bfp16.hpp) consumes the stored bytes as they are: B^T = the W block popped
// from L1 (rows = output rows, values along k), A = x's 8 values of the K block in row 0 and zeros in rows 1-7,
// converted once per K block and used for every block row of the call. C row 0 holds the 8 dot products; rows
// 1-7 stay zero (7/8 of the instruction idle: the launch is bound by its weight stream, docs/kernels.md). One
// accumulator per block row stays in registers across the whole K chunk.
static_assert(kNB <= 2, "at most two block rows per call (two 64-lane accumulators in registers)");
using Mmul = ::aie::mmul<kBlk, kBlk, kBlk, bfp16ebs8, bfp16ebs8, accauto>;
using BfpIn = ::aie::block_vector_input_buffer_stream<bfp16ebs8, 64>;

extern "C" void GBFP_SYMBOL(int8_t *LLAMA_NPU_RESTRICT w, bfloat16 *LLAMA_NPU_RESTRICT x,
                            float *LLAMA_NPU_RESTRICT acc, bfloat16 *LLAMA_NPU_RESTRICT y, int32_t row,
                            int32_t k0) {
  ::aie::set_rounding(::aie::rounding_mode::conv_even);
  const bool first = k0 == 0;
  const bool last = k0 + GBFP_KC >= GBFP_K;
  const bfloat16 *LLAMA_NPU_RESTRICT xc = x + k0;
  const auto z8 = ::aie::zeros<bfloat16, 8>();
  const auto z16 = ::aie::zeros<bfloat16, 16>();
  const auto z32 = ::aie::zeros<bfloat16, 32>();
  const auto f8 = ::aie::zeros<float, 8>();
  const auto f16 = ::aie::zeros<float, 16>();
  const auto f32 = ::aie::zeros<float, 32>();
  Mmul c[kNB];
  BfpIn w0(reinterpret_cast<const bfp16ebs8 *>(w));                               // block row 0 of the call
  BfpIn w1(reinterpret_cast<const bfp16ebs8 *>(w + (kNB > 1 ? kRowBytes : 0)));   // block row 1 (TILE_M = 16)
  if (!first)   // the partial sums of the earlier chunks continue in C row 0 (lanes 0-7)
    for (int r = 0; r < kNB; ++r)
      c[r] = Mmul(::aie::concat(::aie::concat(::aie::concat(::aie::load_v<8>(acc + kBlk * r), f8), f16), f32));
  // A for K block kb: x's 8 values in row 0, zeros in rows 1-7, widened and converted to block float
  auto x_block = [&](int kb) {
    const auto xb = ::aie::concat(::aie::concat(::aie::concat(::aie::load_v<8>(xc + kBlk * kb), z8), z16), z32);
    return ::aie::accum<accfloat, 64>(xb).template to_vector<bfp16ebs8>();
  };
  int kb = 0;
  if (first) {   // the first K block of a row starts C with a mul (no accumulator to read)
    const auto a = x_block(0);
    c[0].mul(a, w0.pop());
    if constexpr (kNB > 1) c[1].mul(a, w1.pop());
    kb = 1;
  }
  for (; kb < kKB; ++kb) {
    const auto a = x_block(kb);
    c[0].mac(a, w0.pop());
    if constexpr (kNB > 1) c[1].mac(a, w1.pop());
  }
  for (int r = 0; r < kNB; ++r) {
    ::aie::accum<accfloat, 8> s = c[r].to_accum().template extract<8>(0);   // C row 0: the 8 rows' sums
    if (last) {
#if GBFP_BIAS
      s = ::aie::add(s, ::aie::load_v<8>(x + GBFP_K + row + kBlk * r));
#endif
      ::aie::store_v(y + row + kBlk * r, s.template to_vector<bfloat16>());
    } else {
      ::aie::store_v(acc + kBlk * r, s.template to_vector<float>());
    }
  }
}

#else  // host scalar path: the same block-float arithmetic, the same order

// x's 8 values as block float (the model of kernel_builder.numerics.to_bfp16ebs8: exponent of the largest
// magnitude, mantissas round-half-even(x / 2^(e-6)) clipped to [-128, 127]); non-finite blocks become NaN
static void x_to_bfp(const bfloat16 *xb, double *q) {
  float amax = 0.0f;
  bool finite = true;
  for (int i = 0; i < kBlk; ++i) {
    const float v = bf16_to_f32(xb[i]);
    finite = finite && std::isfinite(v);
    amax = std::fabs(v) > amax ? std::fabs(v) : amax;
  }
  const int e = amax > 0.0f && finite ? std::ilogb(amax) : 0;
  for (int i = 0; i < kBlk; ++i) {
    double m = std::nearbyint(std::ldexp(static_cast<double>(bf16_to_f32(xb[i])), 6 - e));   // ties to even
    m = m > 127.0 ? 127.0 : (m < -128.0 ? -128.0 : m);
    q[i] = finite ? std::ldexp(m, e - 6) : NAN;
  }
}

extern "C" void GBFP_SYMBOL(int8_t *LLAMA_NPU_RESTRICT w, bfloat16 *LLAMA_NPU_RESTRICT x,
                            float *LLAMA_NPU_RESTRICT acc, bfloat16 *LLAMA_NPU_RESTRICT y, int32_t row,
                            int32_t k0) {
  const bool first = k0 == 0;
  const bool last = k0 + GBFP_KC >= GBFP_K;
  const uint8_t *wb = reinterpret_cast<const uint8_t *>(w);
  float s[GBFP_TILE_M];
  for (int m = 0; m < GBFP_TILE_M; ++m) s[m] = first ? 0.0f : acc[m];
  for (int kb = 0; kb < kKB; ++kb) {
    double q[kBlk];
    x_to_bfp(x + k0 + kBlk * kb, q);
    for (int m = 0; m < GBFP_TILE_M; ++m) {
      const uint8_t *g = wb + (m / kBlk) * kRowBytes + kb * kBlkBytes + (m % kBlk) * (kBlk + 1);   // [E, m0..m7]
      const int e = static_cast<int>(g[0]) - 127 - 6;
      double dot = 0.0;   // exact: 8 products of 8-bit mantissas at one scale
      for (int i = 0; i < kBlk; ++i) dot += q[i] * std::ldexp(static_cast<double>(static_cast<int8_t>(g[1 + i])), e);
      s[m] = static_cast<float>(static_cast<double>(s[m]) + dot);
    }
  }
  for (int m = 0; m < GBFP_TILE_M; ++m) {
    if (last)
      y[row + m] = f32_to_bf16(GBFP_BIAS ? s[m] + bf16_to_f32(x[GBFP_K + row + m]) : s[m]);
    else
      acc[m] = s[m];
  }
}

#endif
