// GEMM micro-kernel of one compute tile: acc[TM x TN] (f32) += a[TM x TK] . w[TN x TK]^T, bf16 operands.
//
// The weight arrives in the Hugging Face [out, in] layout (rows of w are output columns), so the product is
// a . w^T and no transposed copy of any weight exists. All three L1 buffers hold 8x8 blocks, each block
// row-major (64 contiguous elements); the memory-tile DMAs of kernel_builder/gemm/builder.py build them:
//   a   [TM/8][TK/8][8][8]  block (mb, kb) = a[8mb .. 8mb+7][8kb .. 8kb+7]
//   w   [TN/8][TK/8][8][8]  block (nb, kb) = w[8nb .. 8nb+7][8kb .. 8kb+7]   (rows along n, columns along k)
//   acc [TM/8][TN/8][8][8]  block (mb, nb) = acc[8mb .. 8mb+7][8nb .. 8nb+7]; the bf16 output tile likewise.
// Three entry points share one object (one compile per tile shape):
//   zero(acc)      acc = 0
//   mac(a, w, acc) acc += a . w^T over this K slice (f32 accumulation, called once per K step)
//   out(acc, c)    c = bf16(acc), round-to-nearest-even, same blocked layout
#include "kernel_common.h"

#if !defined(GEMM_TILE_M) || !defined(GEMM_TILE_K) || !defined(GEMM_TILE_N) || !defined(GEMM_ZERO_SYMBOL) || \
    !defined(GEMM_MAC_SYMBOL) || !defined(GEMM_OUT_SYMBOL)
#error "compile with the -DGEMM_* defines from kernel_builder/externals.py"
#endif
LLAMA_NPU_REQUIRE(GEMM_TILE_M);
LLAMA_NPU_REQUIRE(GEMM_TILE_K);
LLAMA_NPU_REQUIRE(GEMM_TILE_N);

static constexpr int kBlock = 8;                    // edge of the AIE2P bf16 matrix-multiply block
static constexpr int kBlockElems = kBlock * kBlock;
static constexpr int kMB = GEMM_TILE_M / kBlock;    // row blocks of a / acc
static constexpr int kKB = GEMM_TILE_K / kBlock;    // K blocks of a / w
static constexpr int kNB = GEMM_TILE_N / kBlock;    // row blocks of w = column blocks of acc
static constexpr int kElems = GEMM_TILE_M * GEMM_TILE_N;
static_assert(GEMM_TILE_M % kBlock == 0 && GEMM_TILE_K % kBlock == 0, "GEMM_TILE_M/K must be multiples of 8");
static_assert(GEMM_TILE_N % (2 * kBlock) == 0, "GEMM_TILE_N must be a multiple of 16 (two w blocks per step)");

#if defined(__AIENGINE__)

// The block-float matrix instruction of AIE2P, mac_8x8_8x8T, multiplies an 8x8 A block by an 8x8 B block given
// TRANSPOSED ([N][K] row-major: row j holds the K values of output column j). That is exactly a w block as stored
// (rows along n, columns along k), so w goes to the instruction with no transpose: each a and w block is loaded,
// widened (accum::from_vector) and converted to bfp16ebs8 once (accum::to_vector<bfp16ebs8>), then fed to
// aie::mmul<8, 8, 8, bfp16ebs8, bfp16ebs8> (aie_api aie2p/mmul_bfp16_bfp16.hpp: one mac_8x8_8x8T_conf per call).
// aie_api's bf16 mmul under AIE_API_EMULATE_BFLOAT16_MMUL_WITH_BFP16 (aie2p/mmul_bf16_bf16.hpp) would instead
// transpose B (a row-major K x N block) back to [N][K] and convert both operands on every mac. The numerics are
// that flag's (operands share an exponent per 8 values along K; the vector path's deviation from the f32 contract
// of the scalar path), so the object is still compiled with the flag, which declares them to the cost model.
// Two output column blocks (and two row blocks when TM/8 is even) are computed together: 2-4 accumulators stay
// in registers over this call's whole K slice (one load and one store per 8x8 output block per call), and every
// converted block feeds two macs.
#if AIE_API_EMULATE_BFLOAT16_MMUL_WITH_BFP16 != 1
#error "gemm.cc's vector path is block-float: compile with -DAIE_API_EMULATE_BFLOAT16_MMUL_WITH_BFP16=1"
#endif
static constexpr int kUM = (kMB % 2 == 0) ? 2 : 1;
using Mmul = ::aie::mmul<kBlock, kBlock, kBlock, bfp16ebs8, bfp16ebs8, accauto>;
using Bfp = ::aie::block_vector<bfp16ebs8, kBlockElems>;
static constexpr int kLanes = 32;
static_assert(kElems % kLanes == 0, "GEMM_TILE_M * GEMM_TILE_N must be a multiple of 32 on AIE2P");

// one 8x8 bf16 block (64 contiguous elements) as a block-float vector: blocks of 8 along its rows
static inline Bfp to_bfp(const bfloat16 *LLAMA_NPU_RESTRICT p) {
  ::aie::accum<accfloat, kBlockElems> wide;
  wide.from_vector(::aie::load_v<kBlockElems>(p));
  return wide.template to_vector<bfp16ebs8>();
}

extern "C" void GEMM_ZERO_SYMBOL(float *LLAMA_NPU_RESTRICT acc) {
  for (int i = 0; i < kElems; i += kLanes) ::aie::store_v(acc + i, ::aie::zeros<float, kLanes>());
}

extern "C" void GEMM_MAC_SYMBOL(bfloat16 *LLAMA_NPU_RESTRICT a, bfloat16 *LLAMA_NPU_RESTRICT w,
                                float *LLAMA_NPU_RESTRICT acc) {
  ::aie::set_rounding(::aie::rounding_mode::conv_even);
  for (int mb = 0; mb < kMB; mb += kUM) {
    for (int nb = 0; nb < kNB; nb += 2) {
      float *LLAMA_NPU_RESTRICT c00 = acc + (mb * kNB + nb) * kBlockElems;
      float *LLAMA_NPU_RESTRICT c10 = c00 + kNB * kBlockElems;  // next row block (used when kUM == 2)
      const bfloat16 *LLAMA_NPU_RESTRICT a0 = a + mb * kKB * kBlockElems;
      const bfloat16 *LLAMA_NPU_RESTRICT a1 = a0 + kKB * kBlockElems;
      const bfloat16 *LLAMA_NPU_RESTRICT w0 = w + nb * kKB * kBlockElems;
      const bfloat16 *LLAMA_NPU_RESTRICT w1 = w0 + kKB * kBlockElems;
      Mmul m00(::aie::load_v<kBlockElems>(c00));
      Mmul m01(::aie::load_v<kBlockElems>(c00 + kBlockElems));
      if constexpr (kUM == 2) {
        Mmul m10(::aie::load_v<kBlockElems>(c10));
        Mmul m11(::aie::load_v<kBlockElems>(c10 + kBlockElems));
        for (int kb = 0; kb < kKB; ++kb) {
          const Bfp x0 = to_bfp(a0 + kb * kBlockElems), x1 = to_bfp(a1 + kb * kBlockElems);
          const Bfp y0 = to_bfp(w0 + kb * kBlockElems), y1 = to_bfp(w1 + kb * kBlockElems);
          m00.mac(x0, y0);
          m01.mac(x0, y1);
          m10.mac(x1, y0);
          m11.mac(x1, y1);
        }
        ::aie::store_v(c10, m10.template to_vector<float>());
        ::aie::store_v(c10 + kBlockElems, m11.template to_vector<float>());
      } else {
        for (int kb = 0; kb < kKB; ++kb) {
          const Bfp x0 = to_bfp(a0 + kb * kBlockElems);
          const Bfp y0 = to_bfp(w0 + kb * kBlockElems), y1 = to_bfp(w1 + kb * kBlockElems);
          m00.mac(x0, y0);
          m01.mac(x0, y1);
        }
      }
      ::aie::store_v(c00, m00.template to_vector<float>());
      ::aie::store_v(c00 + kBlockElems, m01.template to_vector<float>());
    }
  }
}

extern "C" void GEMM_OUT_SYMBOL(float *LLAMA_NPU_RESTRICT acc, bfloat16 *LLAMA_NPU_RESTRICT c) {
  ::aie::set_rounding(::aie::rounding_mode::conv_even);
  for (int i = 0; i < kElems; i += kLanes) {
    ::aie::accum<accfloat, kLanes> v;
    v.from_vector(::aie::load_v<kLanes>(acc + i));
    ::aie::store_v(c + i, v.template to_vector<bfloat16>());
  }
}

#else  // host scalar path: the same blocked layouts, f32 accumulation in ascending k order

extern "C" void GEMM_ZERO_SYMBOL(float *LLAMA_NPU_RESTRICT acc) {
  for (int i = 0; i < kElems; ++i) acc[i] = 0.0f;
}

extern "C" void GEMM_MAC_SYMBOL(bfloat16 *LLAMA_NPU_RESTRICT a, bfloat16 *LLAMA_NPU_RESTRICT w,
                                float *LLAMA_NPU_RESTRICT acc) {
  for (int mb = 0; mb < kMB; ++mb)
    for (int nb = 0; nb < kNB; ++nb)
      for (int r = 0; r < kBlock; ++r)
        for (int q = 0; q < kBlock; ++q) {
          float *out = acc + static_cast<long>(mb * kNB + nb) * kBlockElems + r * kBlock + q;
          float s = *out;
          for (int kb = 0; kb < kKB; ++kb) {
            const bfloat16 *ar = a + static_cast<long>(mb * kKB + kb) * kBlockElems + r * kBlock;
            const bfloat16 *wr = w + static_cast<long>(nb * kKB + kb) * kBlockElems + q * kBlock;
            for (int c = 0; c < kBlock; ++c) s += bf16_to_f32(ar[c]) * bf16_to_f32(wr[c]);
          }
          *out = s;
        }
}

extern "C" void GEMM_OUT_SYMBOL(float *LLAMA_NPU_RESTRICT acc, bfloat16 *LLAMA_NPU_RESTRICT c) {
  for (int i = 0; i < kElems; ++i) c[i] = f32_to_bf16(acc[i]);
}

#endif
