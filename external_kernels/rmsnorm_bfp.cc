// RMSNorm of 8-row blocks with the output in block float (the at-rest format of kernel_builder/block_float.py):
//   y = encode(bf16(x * rsqrt(mean(x^2) + eps) * w))      f32 math as rmsnorm.cc, one bf16 RNE rounding, then
// every 8 consecutive columns of a row share one exponent (bfp16ebs8). Data per call: one column chunk of
// RMSNORM_BFP_CHUNK columns of a block's 8 rows, x [8][CHUNK] bf16 (row-major, rows CHUNK apart), the weight chunk
// w [CHUNK], and the chunk's output y: CHUNK/8 blocks of 72 bytes (9*CHUNK contiguous bytes of the block row),
// block kb = rows 0..7 x columns 8kb..8kb+7, row r at byte 9r: [E, m0..m7].
// With -DRMSNORM_BFP_OFFSET=1 the weight is (1 + w), added in f32 (Gemma). With -DRMSNORM_BFP_XWHOLE=1 x holds the
// block's 8 whole rows (rows DIM apart) and only phase 1 is called: its first chunk (c0 == 0) sums the whole rows
// and keeps r first, every call normalises columns [c0, c0 + CHUNK).
//
// One entry point per (dim, chunk, blocks, offset) (kernel_builder/rmsnorm/bfp_external.py), called per chunk in
// two phases: step(x, w, st, y, eps, phase, blk, c0) on columns [c0, c0 + CHUNK) of the tile's block `blk` (of
// RMSNORM_BFP_BLOCKS); st: f32 [256 + 8*BLOCKS], the 8 rows' 32-lane sums of squares, then r per row of every block.
//   phase 0: the sums of squares over the chunk (carried across the chunks of a row; c0 == 0 starts them); the
//            last chunk stores r = invsqrt(mean + eps) of the block's 8 rows in st[256 + 8*blk ..]; y zeroed
//   phase 1: the chunk normalised with the block's r and encoded into y
// The lanes and the order of the sums are rmsnorm.cc's (one 32-lane f32 accumulator per row over ascending
// columns, then reduce_add), and r is used as its bf16 pair: the bf16 values are rmsnorm.cc's, bit for bit.
#include "kernel_common.h"

#if !defined(RMSNORM_BFP_DIM) || !defined(RMSNORM_BFP_CHUNK) || !defined(RMSNORM_BFP_BLOCKS) || \
    !defined(RMSNORM_BFP_SYMBOL)
#error "compile with -DRMSNORM_BFP_DIM -DRMSNORM_BFP_CHUNK -DRMSNORM_BFP_BLOCKS -DRMSNORM_BFP_SYMBOL (kernel_builder/rmsnorm/bfp_external.py)"
#endif
LLAMA_NPU_REQUIRE(RMSNORM_BFP_DIM);
LLAMA_NPU_REQUIRE(RMSNORM_BFP_CHUNK);
LLAMA_NPU_REQUIRE(RMSNORM_BFP_BLOCKS);
#ifndef RMSNORM_BFP_OFFSET
#define RMSNORM_BFP_OFFSET 0
#endif
static_assert(RMSNORM_BFP_OFFSET == 0 || RMSNORM_BFP_OFFSET == 1, "RMSNORM_BFP_OFFSET must be 0 or 1");
static_assert(RMSNORM_BFP_CHUNK % 32 == 0 && RMSNORM_BFP_DIM % RMSNORM_BFP_CHUNK == 0,
              "RMSNORM_BFP_CHUNK must be a multiple of 32 dividing RMSNORM_BFP_DIM");

static constexpr int kRows = 8;                 // rows of one block row
static constexpr int kLanes = 32;               // lanes of a row's sum of squares (rmsnorm.cc's)
static constexpr int kChunk = RMSNORM_BFP_CHUNK;
static constexpr int kBlocks = kChunk / 8;      // 8x8 blocks per chunk
static constexpr float kInvDim = 1.0f / static_cast<float>(RMSNORM_BFP_DIM);
static constexpr int kAcc = kRows * kLanes;     // st[0, kAcc): the sums of squares; then r per row per block
static constexpr int kYBytes = 9 * kChunk;      // output bytes per chunk
#ifndef RMSNORM_BFP_XWHOLE
#define RMSNORM_BFP_XWHOLE 0
#endif
// x in L1: the chunk's 8 x CHUNK elements, or with -DRMSNORM_BFP_XWHOLE=1 the block's 8 whole rows (phase 0 sums
// them whole, phase 1 normalises columns [c0, c0 + CHUNK) of them and leaves y alone in phase 0)
static constexpr int kXStride = RMSNORM_BFP_XWHOLE ? RMSNORM_BFP_DIM : kChunk;   // row stride of x in L1
static constexpr int kSsCols = kXStride;                                           // columns phase 0 sums per call

#if defined(__AIENGINE__)

using Bfp = ::aie::block_vector<bfp16ebs8, 64>;
using BfpOut = ::aie::block_vector_output_buffer_stream<bfp16ebs8, 64>;

static inline void ss(const bfloat16 *LLAMA_NPU_RESTRICT x, float *LLAMA_NPU_RESTRICT acc, int32_t c0) {
  for (int r = 0; r < kRows; ++r) {
    ::aie::accum<accfloat, kLanes> sq = ::aie::zeros<accfloat, kLanes>();
    if (c0 != 0) sq.from_vector(::aie::load_v<kLanes>(acc + r * kLanes));
    const bfloat16 *LLAMA_NPU_RESTRICT xr = x + r * kXStride;
    for (int i = 0; i < kSsCols; i += kLanes) {
      ::aie::vector<bfloat16, kLanes> v = ::aie::load_v<kLanes>(xr + i);
      sq = ::aie::mac(sq, v, v);
    }
    ::aie::store_v(acc + r * kLanes, sq.template to_vector<float>());
  }
}

// the 8 rows' bf16 values of column block kb (8 columns) as one 64-lane vector, row r in lanes 8r..8r+7
static inline ::aie::vector<bfloat16, 64> gather_block(const bfloat16 *LLAMA_NPU_RESTRICT x, int kb) {
  const bfloat16 *p = x + 8 * kb;
  return ::aie::concat(::aie::load_v<8>(p), ::aie::load_v<8>(p + kXStride), ::aie::load_v<8>(p + 2 * kXStride),
                       ::aie::load_v<8>(p + 3 * kXStride), ::aie::load_v<8>(p + 4 * kXStride),
                       ::aie::load_v<8>(p + 5 * kXStride), ::aie::load_v<8>(p + 6 * kXStride),
                       ::aie::load_v<8>(p + 7 * kXStride));
}

// after the last chunk of a block: r = invsqrt(mean + eps) of its 8 rows (rmsnorm.cc's reduction and invsqrt)
static inline void finish_rows(const float *LLAMA_NPU_RESTRICT acc, float *LLAMA_NPU_RESTRICT r_out, float eps) {
  for (int r = 0; r < kRows; ++r)
    r_out[r] = ::aie::invsqrt(::aie::reduce_add(::aie::load_v<kLanes>(acc + r * kLanes)) * kInvDim + eps);
}

static inline void norm(const bfloat16 *LLAMA_NPU_RESTRICT x, const bfloat16 *LLAMA_NPU_RESTRICT w,
                        const float *LLAMA_NPU_RESTRICT r_in, int8_t *LLAMA_NPU_RESTRICT y) {
  // per row r as rmsnorm.cc's bf16 pair, spread over the row's 8 lanes of a block
  ::aie::vector<bfloat16, 8> hi[kRows], lo[kRows];
  for (int r = 0; r < kRows; ++r) {
    const float rr = r_in[r];
    const bfloat16 r_hi = static_cast<bfloat16>(rr);
    const bfloat16 r_lo = static_cast<bfloat16>(rr - static_cast<float>(r_hi));
    hi[r] = ::aie::broadcast<bfloat16, 8>(r_hi);
    lo[r] = ::aie::broadcast<bfloat16, 8>(r_lo);
  }
  const ::aie::vector<bfloat16, 64> rh = ::aie::concat(hi[0], hi[1], hi[2], hi[3], hi[4], hi[5], hi[6], hi[7]);
  const ::aie::vector<bfloat16, 64> rl = ::aie::concat(lo[0], lo[1], lo[2], lo[3], lo[4], lo[5], lo[6], lo[7]);
#if RMSNORM_BFP_OFFSET
  const ::aie::accum<accfloat, 64> one(::aie::broadcast<bfloat16, 64>(static_cast<bfloat16>(1.0f)));
#endif
  BfpOut out(reinterpret_cast<bfp16ebs8 *>(y));
  for (int kb = 0; kb < kBlocks; ++kb) {
    const ::aie::vector<bfloat16, 64> xv = gather_block(x, kb);
    const ::aie::vector<bfloat16, 8> w8 = ::aie::load_v<8>(w + 8 * kb);
    const ::aie::vector<bfloat16, 64> wv = ::aie::concat(w8, w8, w8, w8, w8, w8, w8, w8);
    ::aie::accum<accfloat, 64> t = ::aie::mac(::aie::mul(xv, rh), xv, rl);   // x * r
    const ::aie::vector<bfloat16, 64> t_hi = t.template to_vector<bfloat16>();
    const ::aie::vector<bfloat16, 64> t_lo = ::aie::sub(t, t_hi).template to_vector<bfloat16>();
#if RMSNORM_BFP_OFFSET
    const ::aie::accum<accfloat, 64> w1 = ::aie::add(one, wv);
    const ::aie::vector<bfloat16, 64> w1_hi = w1.template to_vector<bfloat16>();
    const ::aie::vector<bfloat16, 64> w1_lo = ::aie::sub(w1, w1_hi).template to_vector<bfloat16>();
    const ::aie::accum<accfloat, 64> o = ::aie::mac(::aie::mac(::aie::mul(t_hi, w1_hi), t_lo, w1_hi), t_hi, w1_lo);
#else
    const ::aie::accum<accfloat, 64> o = ::aie::mac(::aie::mul(t_hi, wv), t_lo, wv);   // (x * r) * w
#endif
    // rounded to bf16 (RNE) as rmsnorm.cc stores it, then widened and converted as gemm.cc's to_bfp converts a
    // stored bf16 block: the same bytes block_float.encode makes of the bf16 result
    ::aie::accum<accfloat, 64> wide;
    wide.from_vector(o.template to_vector<bfloat16>());
    out << wide.template to_vector<bfp16ebs8>();
  }
}

extern "C" void RMSNORM_BFP_SYMBOL(bfloat16 *LLAMA_NPU_RESTRICT x, bfloat16 *LLAMA_NPU_RESTRICT w,
                                   float *LLAMA_NPU_RESTRICT st, int8_t *LLAMA_NPU_RESTRICT y, float eps,
                                   int32_t phase, int32_t blk, int32_t c0) {
  ::aie::set_rounding(::aie::rounding_mode::conv_even);
  if (phase == 0) {
    ss(x, st, c0);
    if (c0 + kSsCols == RMSNORM_BFP_DIM) finish_rows(st, st + kAcc + kRows * blk, eps);
    if (!RMSNORM_BFP_XWHOLE)
      for (int i = 0; i < kYBytes; i += 32) ::aie::store_v(y + i, ::aie::zeros<int8_t, 32>());
  } else {
    if (RMSNORM_BFP_XWHOLE && c0 == 0) {   // whole rows: the first chunk's call sums them first
      ss(x, st, 0);
      finish_rows(st, st + kAcc + kRows * blk, eps);
    }
    norm(x + (RMSNORM_BFP_XWHOLE ? c0 : 0), w, st + kAcc + kRows * blk, y);
  }
}

#else  // host scalar path: the reference's f32 operations (sequential sum of squares), then block_float.encode

#include <cstdint>

static inline void ss(const bfloat16 *LLAMA_NPU_RESTRICT x, float *LLAMA_NPU_RESTRICT acc, int32_t c0) {
  for (int r = 0; r < kRows; ++r) {
    float ss = c0 == 0 ? 0.0f : acc[r * kLanes];
    for (int i = 0; i < kSsCols; ++i) {
      const float v = bf16_to_f32(x[r * kXStride + i]);
      ss += v * v;
    }
    acc[r * kLanes] = ss;
  }
}

// one group of 8 bf16 values as block_float.py encodes it: E = floor(log2(max |v|)) + 127 (an all-zero group and
// groups under 2^-127 take -127), m = round-half-even(v / 2^(e-6)) clipped to [-128, 127]
static void encode_group(const float *v, int8_t *out) {
  float amax = 0.0f;
  for (int i = 0; i < 8; ++i) amax = std::fabs(v[i]) > amax ? std::fabs(v[i]) : amax;
  int e = amax > 0.0f ? std::ilogb(amax) : -127;
  e = e < -127 ? -127 : (e > 128 ? 128 : e);
  out[0] = static_cast<int8_t>(static_cast<uint8_t>(e + 127));
  for (int i = 0; i < 8; ++i) {
    double m = std::nearbyint(std::ldexp(static_cast<double>(v[i]), 6 - e));   // exact scaling, ties to even
    m = m > 127.0 ? 127.0 : (m < -128.0 ? -128.0 : m);
    out[1 + i] = static_cast<int8_t>(m);
  }
}

static inline void finish_rows(const float *LLAMA_NPU_RESTRICT acc, float *LLAMA_NPU_RESTRICT r_out, float eps) {
  for (int r = 0; r < kRows; ++r) r_out[r] = 1.0f / std::sqrt(acc[r * kLanes] * kInvDim + eps);
}

static inline void norm(const bfloat16 *LLAMA_NPU_RESTRICT x, const bfloat16 *LLAMA_NPU_RESTRICT w,
                        const float *LLAMA_NPU_RESTRICT r_in, int8_t *LLAMA_NPU_RESTRICT y) {
  for (int r = 0; r < kRows; ++r) {
    const float rr = r_in[r];
    for (int kb = 0; kb < kBlocks; ++kb) {
      float v[8];
      for (int i = 0; i < 8; ++i) {
        const int c = 8 * kb + i;
        const float wf = bf16_to_f32(w[c]) + static_cast<float>(RMSNORM_BFP_OFFSET);
        v[i] = bf16_to_f32(f32_to_bf16((bf16_to_f32(x[r * kXStride + c]) * rr) * wf));
      }
      encode_group(v, y + kb * 72 + r * 9);
    }
  }
}


extern "C" void RMSNORM_BFP_SYMBOL(bfloat16 *LLAMA_NPU_RESTRICT x, bfloat16 *LLAMA_NPU_RESTRICT w,
                                   float *LLAMA_NPU_RESTRICT st, int8_t *LLAMA_NPU_RESTRICT y, float eps,
                                   int32_t phase, int32_t blk, int32_t c0) {
  if (phase == 0) {
    ss(x, st, c0);
    if (c0 + kSsCols == RMSNORM_BFP_DIM) finish_rows(st, st + kAcc + kRows * blk, eps);
    if (!RMSNORM_BFP_XWHOLE) std::memset(y, 0, kYBytes);
  } else {
    if (RMSNORM_BFP_XWHOLE && c0 == 0) {   // whole rows: the first chunk's call sums them first
      ss(x, st, 0);
      finish_rows(st, st + kAcc + kRows * blk, eps);
    }
    norm(x + (RMSNORM_BFP_XWHOLE ? c0 : 0), w, st + kAcc + kRows * blk, y);
  }
}

#endif
