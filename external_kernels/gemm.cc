// GEMM micro-kernel of one compute tile: acc[TM x TN] (f32) += a[TM x TK] . w[TN x TK]^T, bf16 operands.
//
// The weight arrives in the Hugging Face [out, in] layout (rows of w are output columns), so the product is
// a . w^T and no transposed copy of any weight exists. All L1 buffers hold 8x8 blocks, each block row-major
// (64 contiguous elements); the memory-tile DMAs of kernel_builder/gemm/builder.py build them:
//   a   [TM/8][TK/8][8][8]  block (mb, kb) = a[8mb .. 8mb+7][8kb .. 8kb+7]
//   w   [TN/8][TK/8][8][8]  block (nb, kb) = w[8nb .. 8nb+7][8kb .. 8kb+7]   (rows along n, columns along k)
//   acc [TM/8][TN/8][8][8]  block (mb, nb) = acc[8mb .. 8mb+7][8nb .. 8nb+7], f32
// The accumulator buffer is declared as 2*TM*TN bf16 (the bytes of TM*TN f32): every epilogue writes its bf16
// output tile IN PLACE over the front of it (output element i at bf16 offset i, never beyond f32 element i/2,
// which the ascending loops have already read), so no separate output buffer takes L1.
// Entry points sharing one object (one compile per tile shape):
//   zero(acc)      acc = 0
//   mac(a, w, acc, scratch)  acc += a . w^T over this K slice (f32 accumulation, called once per K step);
//                  scratch: TM*TK*9/16 bf16 of L1 (TM*TK/64 block-float blocks of 72 bytes) where the vector path
//                  keeps this slice's a blocks converted once; the vector path converts the w tile to block
//                  float once IN PLACE (its bytes are garbage after the call: the next K step's DMA refills it)
//   out(acc)       c = bf16(acc) in place, round-to-nearest-even, layout [TM/8][TN/8][8][8]
//   glu(acc)       gated epilogue: the tile's column blocks come in pairs (the weight's rows interleaved by 8:
//                  kernel_builder/gemm_swiglu/layout.py), block 2q the gate and block 2q+1 the up projection of
//                  output block q; c = silu(bf16(gate)) * bf16(up) in place, layout [TM/8][TN/16][8][8]
//                  (the arithmetic of swiglu.cc on the rounded accumulators: the fused and unfused paths agree)
//   bias(acc, b)   c = bf16(acc + b[column]) in place (b: TN bf16, this tile's slice of the bias row)
#include "kernel_common.h"

#if !defined(GEMM_TILE_M) || !defined(GEMM_TILE_K) || !defined(GEMM_TILE_N) || !defined(GEMM_ZERO_SYMBOL) || \
    !defined(GEMM_MAC_SYMBOL) || !defined(GEMM_OUT_SYMBOL) || !defined(GEMM_GLU_SYMBOL) || !defined(GEMM_BIAS_SYMBOL)
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
static constexpr int kHalfNB = kNB / 2;            // (gate, up) column-block pairs = output column blocks
static_assert(GEMM_TILE_M % kBlock == 0 && GEMM_TILE_K % kBlock == 0, "GEMM_TILE_M/K must be multiples of 8");
static_assert(GEMM_TILE_N % (2 * kBlock) == 0, "GEMM_TILE_N must be a multiple of 16 (two w blocks per step)");
#ifndef GEMM_W_CHUNK_K
#define GEMM_W_CHUNK_K GEMM_TILE_K   // the block-float w tile in one K chunk: [kNB][kKB] (this file's mac)
#endif
static constexpr int kWC = GEMM_W_CHUNK_K / kBlock;  // K blocks per chunk of the block-float w tile
static_assert(GEMM_W_CHUNK_K % kBlock == 0 && GEMM_TILE_K % GEMM_W_CHUNK_K == 0, "GEMM_W_CHUNK_K must divide TILE_K");

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
// in registers over this call's whole K slice (one load and one store per 8x8 output block per call). Each a block
// is converted once per call into the block-float scratch, each w block once per call in place over the w tile
// (aie_api's block_vector buffer streams, as mlir-aie's aie2p mm_bfp.cc reads its pre-converted operands); both
// are re-read as block float for every register block.
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

extern "C" void GEMM_ZERO_SYMBOL(bfloat16 *LLAMA_NPU_RESTRICT acc_bytes) {
  float *LLAMA_NPU_RESTRICT acc = reinterpret_cast<float *>(acc_bytes);
  for (int i = 0; i < kElems; i += kLanes) ::aie::store_v(acc + i, ::aie::zeros<float, kLanes>());
}

using BfpOut = ::aie::block_vector_output_buffer_stream<bfp16ebs8, kBlockElems>;
using BfpIn = ::aie::block_vector_input_buffer_stream<bfp16ebs8, kBlockElems>;

// `count` consecutive 8x8 bf16 blocks converted to block float, stored in the same order from `dst`
static inline void to_bfp_blocks(const bfloat16 *src, bfp16ebs8 *dst, int count) {  // dst may alias src (in place)
  BfpOut out(dst);
  for (int i = 0; i < count; ++i) out << to_bfp(src + i * kBlockElems);
}

// acc += a . w^T on block-float operands in L1: bfp_a [kMB][kKB] and bfp_w [kKB/kWC][kNB][kWC] blocks of 72 bytes
// (one v64bfp16ebs8 each, rows of w = output columns; K chunks of kWC blocks, one chunk in this file's mac), the
// register-blocked loop of the mac (gemm_bfp.cc's mac runs it on a weight tile stored in block float at rest).
// kAChunked: bfp_a in the w tile's chunked order [kKB/kWC][kMB][kWC] (gemm_bfp.cc's mac on an A tile at rest)
template <bool kAChunked>
static constexpr int a_block0(int mb, int c) { return kAChunked ? (c * kMB + mb) * kWC : mb * kKB + c * kWC; }

template <bool kAChunked = false>
static inline void mac_bfp_blocks(bfp16ebs8 *bfp_a, bfp16ebs8 *bfp_w, float *LLAMA_NPU_RESTRICT acc) {
  for (int mb = 0; mb < kMB; mb += kUM) {
    for (int nb = 0; nb < kNB; nb += 2) {
      float *LLAMA_NPU_RESTRICT c00 = acc + (mb * kNB + nb) * kBlockElems;
      float *LLAMA_NPU_RESTRICT c10 = c00 + kNB * kBlockElems;  // next row block (used when kUM == 2)
      Mmul m00(::aie::load_v<kBlockElems>(c00));
      Mmul m01(::aie::load_v<kBlockElems>(c00 + kBlockElems));
      if constexpr (kUM == 2) {
        Mmul m10(::aie::load_v<kBlockElems>(c10));
        Mmul m11(::aie::load_v<kBlockElems>(c10 + kBlockElems));
        for (int c = 0; c < kKB / kWC; ++c) {   // the w blocks of K chunk c: a run of kWC per block row
          BfpIn x0s(bfp_a), x1s(bfp_a), y0s(bfp_w), y1s(bfp_w);
          x0s.seek(a_block0<kAChunked>(mb, c));
          x1s.seek(a_block0<kAChunked>(mb + 1, c));
          y0s.seek((c * kNB + nb) * kWC);
          y1s.seek((c * kNB + nb + 1) * kWC);
          for (int kb = 0; kb < kWC; ++kb) {
            const Bfp x0 = x0s.pop(), x1 = x1s.pop(), y0 = y0s.pop(), y1 = y1s.pop();
            m00.mac(x0, y0);
            m01.mac(x0, y1);
            m10.mac(x1, y0);
            m11.mac(x1, y1);
          }
        }
        ::aie::store_v(c10, m10.template to_vector<float>());
        ::aie::store_v(c10 + kBlockElems, m11.template to_vector<float>());
      } else {
        for (int c = 0; c < kKB / kWC; ++c) {
          BfpIn x0s(bfp_a), y0s(bfp_w), y1s(bfp_w);
          x0s.seek(a_block0<kAChunked>(mb, c));
          y0s.seek((c * kNB + nb) * kWC);
          y1s.seek((c * kNB + nb + 1) * kWC);
          for (int kb = 0; kb < kWC; ++kb) {
            const Bfp x0 = x0s.pop(), y0 = y0s.pop(), y1 = y1s.pop();
            m00.mac(x0, y0);
            m01.mac(x0, y1);
          }
        }
      }
      ::aie::store_v(c00, m00.template to_vector<float>());
      ::aie::store_v(c00 + kBlockElems, m01.template to_vector<float>());
    }
  }
}

#if !defined(GEMM_BFP_MAC_SYMBOL)  // gemm_bfp.cc's object reads chunked w tiles: this in-place [nb][kb] one is not in it
extern "C" void GEMM_MAC_SYMBOL(bfloat16 *LLAMA_NPU_RESTRICT a, bfloat16 *LLAMA_NPU_RESTRICT w,
                                bfloat16 *LLAMA_NPU_RESTRICT acc_bytes, bfloat16 *LLAMA_NPU_RESTRICT scratch) {
  float *LLAMA_NPU_RESTRICT acc = reinterpret_cast<float *>(acc_bytes);
  bfp16ebs8 *bfp_a = reinterpret_cast<bfp16ebs8 *>(scratch);
  ::aie::set_rounding(::aie::rounding_mode::conv_even);
  // every a block converted once per call into the block-float scratch, in its [mb][kb] order
  to_bfp_blocks(a, bfp_a, kMB * kKB);
  // every w block converted once per call IN PLACE, in its [nb][kb] order: block i's 72 bytes go to byte 72*i,
  // below the 128*(i+1) where the next unread bf16 block starts, so no write reaches an unread block
  bfp16ebs8 *bfp_w = reinterpret_cast<bfp16ebs8 *>(w);
  to_bfp_blocks(w, bfp_w, kNB * kKB);
  mac_bfp_blocks(bfp_a, bfp_w, acc);
}
#endif

// f32 lanes [i, i + 32) of the accumulator as bf16 (RNE)
static inline ::aie::vector<bfloat16, kLanes> acc_bf16(const float *acc, int i) {
  ::aie::accum<accfloat, kLanes> v;
  v.from_vector(::aie::load_v<kLanes>(acc + i));
  return v.template to_vector<bfloat16>();
}

extern "C" void GEMM_OUT_SYMBOL(bfloat16 *acc_bytes) {
  ::aie::set_rounding(::aie::rounding_mode::conv_even);
  const float *acc = reinterpret_cast<const float *>(acc_bytes);
  for (int i = 0; i < kElems; i += kLanes) ::aie::store_v(acc_bytes + i, acc_bf16(acc, i));
}

// silu(g) * u on bf16 lanes, as swiglu.cc computes it: sigmoid(g) = 1 / (1 + 2^(-g * log2e)) with -g * log2e from a
// bf16 pair of log2e, exp2 and inv in bf16, silu rounded to bf16 before the product with u.
struct GluConsts {
  bfloat16 nl_hi, nl_lo;
  ::aie::accum<accfloat, kLanes> one;
};

static inline GluConsts glu_consts() {
  constexpr float kLog2e = 1.4426950408889634f;
  const bfloat16 nl_hi = static_cast<bfloat16>(-kLog2e);
  const bfloat16 nl_lo = static_cast<bfloat16>(-kLog2e - static_cast<float>(nl_hi));
  return {nl_hi, nl_lo, ::aie::accum<accfloat, kLanes>(::aie::broadcast<bfloat16, kLanes>(static_cast<bfloat16>(1.0f)))};
}

// the 32 outputs of gate lanes [gi, gi + 32) and up lanes [gi + 64, gi + 96) of the accumulator, bf16
static inline ::aie::vector<bfloat16, kLanes> glu_lanes(const float *acc, int gi, const GluConsts &c) {
  const ::aie::vector<bfloat16, kLanes> g = acc_bf16(acc, gi);
  const ::aie::vector<bfloat16, kLanes> u = acc_bf16(acc, gi + kBlockElems);
  ::aie::accum<accfloat, kLanes> t = ::aie::mac(::aie::mul(g, c.nl_hi), g, c.nl_lo);  // -g * log2e
  ::aie::vector<bfloat16, kLanes> e = ::aie::exp2<bfloat16>(t.template to_vector<float>());
  ::aie::vector<bfloat16, kLanes> sig = ::aie::inv(::aie::add(c.one, e).template to_vector<bfloat16>());
  ::aie::accum<accfloat, kLanes> silu = ::aie::mul(g, sig);
  ::aie::accum<accfloat, kLanes> y = ::aie::mul(silu.template to_vector<bfloat16>(), u);
  return y.template to_vector<bfloat16>();
}

extern "C" void GEMM_GLU_SYMBOL(bfloat16 *acc_bytes) {
  ::aie::set_rounding(::aie::rounding_mode::conv_even);
  const float *acc = reinterpret_cast<const float *>(acc_bytes);
  const GluConsts c = glu_consts();
  for (int mb = 0; mb < kMB; ++mb)
    for (int nb = 0; nb < kHalfNB; ++nb)
      for (int h = 0; h < kBlockElems; h += kLanes) {
        const int gi = (mb * kNB + 2 * nb) * kBlockElems + h;   // gate block 2nb, up block 2nb + 1
        ::aie::store_v(acc_bytes + (mb * kHalfNB + nb) * kBlockElems + h, glu_lanes(acc, gi, c));
      }
}

// acc + b[column], one rounding: a 32-lane step covers 4 rows of an 8x8 block, so the block's 8 bias values
// repeat 4 times along the lanes. Blocks in ascending order (the in-place writes trail the reads).
extern "C" void GEMM_BIAS_SYMBOL(bfloat16 *acc_bytes, bfloat16 *LLAMA_NPU_RESTRICT b) {
  ::aie::set_rounding(::aie::rounding_mode::conv_even);
  const float *acc = reinterpret_cast<const float *>(acc_bytes);
  for (int mb = 0; mb < kMB; ++mb)
    for (int nb = 0; nb < kNB; ++nb) {
      const ::aie::vector<bfloat16, kBlock> b8 = ::aie::load_v<kBlock>(b + nb * kBlock);
      const ::aie::vector<bfloat16, kLanes> pat = ::aie::concat(b8, b8, b8, b8);
      for (int h = 0; h < kBlockElems; h += kLanes) {
        const int i = (mb * kNB + nb) * kBlockElems + h;
        ::aie::accum<accfloat, kLanes> v;
        v.from_vector(::aie::load_v<kLanes>(acc + i));
        ::aie::store_v(acc_bytes + i, ::aie::add(v, pat).template to_vector<bfloat16>());
      }
    }
}

#else  // host scalar path: the same blocked layouts, f32 accumulation in ascending k order

extern "C" void GEMM_ZERO_SYMBOL(bfloat16 *LLAMA_NPU_RESTRICT acc_bytes) {
  float *acc = reinterpret_cast<float *>(acc_bytes);
  for (int i = 0; i < kElems; ++i) acc[i] = 0.0f;
}

extern "C" void GEMM_MAC_SYMBOL(bfloat16 *LLAMA_NPU_RESTRICT a, bfloat16 *LLAMA_NPU_RESTRICT w,
                                bfloat16 *LLAMA_NPU_RESTRICT acc_bytes, bfloat16 *LLAMA_NPU_RESTRICT scratch) {
  (void)scratch;  // the vector path's block-float copy of a; the scalar path reads a directly
  float *acc = reinterpret_cast<float *>(acc_bytes);
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

// in place: output element i (bf16 offset i) overwrites bytes of f32 elements < i/2 + 1, all read already
extern "C" void GEMM_OUT_SYMBOL(bfloat16 *acc_bytes) {
  const float *acc = reinterpret_cast<const float *>(acc_bytes);
  for (int i = 0; i < kElems; ++i) {
    const float v = acc[i];
    acc_bytes[i] = f32_to_bf16(v);
  }
}

extern "C" void GEMM_GLU_SYMBOL(bfloat16 *acc_bytes) {
  const float *acc = reinterpret_cast<const float *>(acc_bytes);
  for (int mb = 0; mb < kMB; ++mb)
    for (int nb = 0; nb < kHalfNB; ++nb)
      for (int e = 0; e < kBlockElems; ++e) {
        const int gi = (mb * kNB + 2 * nb) * kBlockElems + e;   // gate block 2nb, up block 2nb + 1
        const float g = bf16_to_f32(f32_to_bf16(acc[gi]));
        const float u = bf16_to_f32(f32_to_bf16(acc[gi + kBlockElems]));
        const float silu = g / (1.0f + std::exp(-g));
        acc_bytes[(mb * kHalfNB + nb) * kBlockElems + e] = f32_to_bf16(silu * u);
      }
}

extern "C" void GEMM_BIAS_SYMBOL(bfloat16 *acc_bytes, bfloat16 *LLAMA_NPU_RESTRICT b) {
  const float *acc = reinterpret_cast<const float *>(acc_bytes);
  for (int i = 0; i < kElems; ++i) {
    const int col = ((i / kBlockElems) % kNB) * kBlock + i % kBlock;
    const float v = acc[i] + bf16_to_f32(b[col]);
    acc_bytes[i] = f32_to_bf16(v);
  }
}

#endif
