// GEMM micro-kernel with the weight tile at rest in block float (kernel_builder/gemm_bfp): acc[TM x TN] (f32) +=
// a[TM x TK] . w[TN x TK]^T with a in bf16 and w in bfp16ebs8, the bytes kernel_builder/block_float.py stores
// weights in (converted once on the host at load).
//
// L1 layouts (the memory-tile DMAs of kernel_builder/gemm/builder.py with the "bfp16" W format build them):
//   a   [TM/8][TK/8][8][8] bf16  block (mb, kb) = a[8mb .. 8mb+7][8kb .. 8kb+7] (as gemm.cc)
//   w   [TK/C][TN/8][C/8][72] bytes, C = GEMM_W_CHUNK_K: block (nb, kb) = w[8nb .. 8nb+7][8kb .. 8kb+7] as one
//                                v64bfp16ebs8 at block ((kb / (C/8)) * TN/8 + nb) * C/8 + kb % (C/8): per row r of
//                                the block 9 bytes at 9r: [E, m0 .. m7], value m_i * 2^(E - 127 - 6) (AMD's published
//                                layout, mlir-aie programming_examples/ml/block_datatypes/helper.h). Each K chunk is
//                                the at-rest encoding of its [TN, C] slice (per block row a run of C/8 blocks); the
//                                chunks keep every contiguous DMA run at most 9C bytes (one memory-tile BD dim:
//                                kernel_builder/gemm/external.py bfp_chunk_k).
//   acc [TM/8][TN/8][8][8] f32   (as gemm.cc)
// Entry point of this file:
//   mac(a, w, acc, scratch)  acc += a . w^T over this K slice; scratch: TM*TK*9/16 bf16 of L1 where the vector path
//                            keeps this slice's a blocks converted to block float once per call (as gemm.cc). The w
//                            blocks are popped straight from the tile (no conversion, the tile is not written).
//   maca(a, w, acc)          the same with the A tile at rest in block float too (kernel_builder/gemm/a_bfp.py: the
//                            activation stored like a weight, i8 [m/8, 9k]), in the w tile's chunked order
//                            [TK/C][TM/8][C/8] blocks: popped as stored, no conversion, no scratch
// zero / out / glu / bias are gemm.cc's (included below under this kernel's symbol names, one object); gemm.cc's
// bf16 mac is compiled under a symbol of its own and not called.
//
// Numerics: the vector path multiplies the same block-float values as gemm.cc's vector path on the bf16 weight
// (its in-core conversion rounds each group of 8 the way block_float.encode does: kernel_builder.numerics.
// to_bfp16ebs8), so both paths give the same bits. The host scalar path decodes the bytes and accumulates exact
// bf16 x block-float products in f32 in ascending k (gemm.cc's scalar order): the f32 contract on the decoded weight.
#include "gemm.cc"

#if !defined(GEMM_BFP_MAC_SYMBOL)
#error "compile with -DGEMM_BFP_MAC_SYMBOL=... (kernel_builder/gemm/external.py gemm_kernels(..., w='bfp16'))"
#endif

static constexpr int kBfpBlockBytes = 72;   // one 8x8 block: 8 rows x [E, m0 .. m7]
static constexpr int kBfpRowBytes = 9;

#if defined(__AIENGINE__)

extern "C" void GEMM_BFP_MAC_SYMBOL(bfloat16 *LLAMA_NPU_RESTRICT a, uint8_t *LLAMA_NPU_RESTRICT w,
                                    bfloat16 *LLAMA_NPU_RESTRICT acc_bytes, bfloat16 *LLAMA_NPU_RESTRICT scratch) {
  float *LLAMA_NPU_RESTRICT acc = reinterpret_cast<float *>(acc_bytes);
  bfp16ebs8 *bfp_a = reinterpret_cast<bfp16ebs8 *>(scratch);
  ::aie::set_rounding(::aie::rounding_mode::conv_even);
  to_bfp_blocks(a, bfp_a, kMB * kKB);    // every a block converted once per call, [mb][kb] order
  // the w tile IS a sequence of v64bfp16ebs8 blocks in the chunked order mac_bfp_blocks reads: read as stored
  mac_bfp_blocks(bfp_a, reinterpret_cast<bfp16ebs8 *>(w), acc);
}

#if defined(GEMM_BFP_MACA_SYMBOL)
extern "C" void GEMM_BFP_MACA_SYMBOL(uint8_t *LLAMA_NPU_RESTRICT a, uint8_t *LLAMA_NPU_RESTRICT w,
                                     bfloat16 *LLAMA_NPU_RESTRICT acc_bytes) {
  float *LLAMA_NPU_RESTRICT acc = reinterpret_cast<float *>(acc_bytes);
  // both tiles ARE sequences of v64bfp16ebs8 blocks in the chunked order: read as stored
  mac_bfp_blocks<true>(reinterpret_cast<bfp16ebs8 *>(a), reinterpret_cast<bfp16ebs8 *>(w), acc);
}
#endif

#else  // host scalar path: decode each weight (published layout), f32 accumulation in ascending k

extern "C" void GEMM_BFP_MAC_SYMBOL(bfloat16 *LLAMA_NPU_RESTRICT a, uint8_t *LLAMA_NPU_RESTRICT w,
                                    bfloat16 *LLAMA_NPU_RESTRICT acc_bytes, bfloat16 *LLAMA_NPU_RESTRICT scratch) {
  (void)scratch;  // the vector path's block-float copy of a
  float *acc = reinterpret_cast<float *>(acc_bytes);
  for (int mb = 0; mb < kMB; ++mb)
    for (int nb = 0; nb < kNB; ++nb)
      for (int r = 0; r < kBlock; ++r)
        for (int q = 0; q < kBlock; ++q) {
          float *out = acc + static_cast<long>(mb * kNB + nb) * kBlockElems + r * kBlock + q;
          float s = *out;
          for (int kb = 0; kb < kKB; ++kb) {
            const bfloat16 *ar = a + static_cast<long>(mb * kKB + kb) * kBlockElems + r * kBlock;
            const long blk = (static_cast<long>(kb / kWC) * kNB + nb) * kWC + kb % kWC;
            const uint8_t *wr = w + blk * kBfpBlockBytes + q * kBfpRowBytes;
            const int e = static_cast<int>(wr[0]) - 127 - 6;   // the scale of this row's 8 mantissas
            for (int c = 0; c < kBlock; ++c) {
              // m * 2^e is exact in f32 (at most 8 significant bits, e >= -133), so is its product with a bf16
              const float wv = std::ldexp(static_cast<float>(static_cast<int8_t>(wr[1 + c])), e);
              s += bf16_to_f32(ar[c]) * wv;
            }
          }
          *out = s;
        }
}

#if defined(GEMM_BFP_MACA_SYMBOL)
// the scalar path of the A-at-rest mac: both operands decoded (published layout, chunked order), exact products
extern "C" void GEMM_BFP_MACA_SYMBOL(uint8_t *LLAMA_NPU_RESTRICT a, uint8_t *LLAMA_NPU_RESTRICT w,
                                     bfloat16 *LLAMA_NPU_RESTRICT acc_bytes) {
  float *acc = reinterpret_cast<float *>(acc_bytes);
  for (int mb = 0; mb < kMB; ++mb)
    for (int nb = 0; nb < kNB; ++nb)
      for (int r = 0; r < kBlock; ++r)
        for (int q = 0; q < kBlock; ++q) {
          float *out = acc + static_cast<long>(mb * kNB + nb) * kBlockElems + r * kBlock + q;
          float s = *out;
          for (int kb = 0; kb < kKB; ++kb) {
            const long ablk = (static_cast<long>(kb / kWC) * kMB + mb) * kWC + kb % kWC;
            const long wblk = (static_cast<long>(kb / kWC) * kNB + nb) * kWC + kb % kWC;
            const uint8_t *ar = a + ablk * kBfpBlockBytes + r * kBfpRowBytes;
            const uint8_t *wr = w + wblk * kBfpBlockBytes + q * kBfpRowBytes;
            const int ea = static_cast<int>(ar[0]) - 127 - 6, ew = static_cast<int>(wr[0]) - 127 - 6;
            for (int c = 0; c < kBlock; ++c) {
              // each decoded value has at most 8 significant bits: the product (<= 16 bits) is exact in f32
              const float av = std::ldexp(static_cast<float>(static_cast<int8_t>(ar[1 + c])), ea);
              const float wv = std::ldexp(static_cast<float>(static_cast<int8_t>(wr[1 + c])), ew);
              s += av * wv;
            }
          }
          *out = s;
        }
}
#endif

#endif

#include "gemm_c_bfp.h"   // outc / gluc: the epilogues writing C in block float
