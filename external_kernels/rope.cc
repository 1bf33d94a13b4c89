// Half-split RoPE (HF rotate_half convention) of ROPE_ROWS position rows x ROPE_HEADS heads:
//   x[r][h*D .. (h+1)*D), lut[r][D] = [cos(p_r*f_0..f_{d-1}) | sin(p_r*f_0..f_{d-1})], d = D/2, D = ROPE_HEAD_DIM
//   y1 = x1*cos - x2*sin,  y2 = x2*cos + x1*sin   (per head; x1 = first half, x2 = second half)
// x and y are [ROPE_ROWS][ROPE_HEADS * D] row-major (the heads of a row are contiguous), lut is [ROPE_ROWS][D].
// Products of two bf16 values are exact in f32, so each output is one f32 add/sub then one bf16 RNE rounding:
// the value the numpy reference produces.
//
// Compiled once per (head_dim, heads, rows) with -DROPE_HEAD_DIM -DROPE_HEADS -DROPE_ROWS
// -DROPE_SYMBOL=rope_bf16_hd<D>_h<H>_r<R> (kernel_builder/externals.py).
#include "kernel_common.h"

#if !defined(ROPE_HEAD_DIM) || !defined(ROPE_HEADS) || !defined(ROPE_ROWS) || !defined(ROPE_SYMBOL)
#error "compile with -DROPE_HEAD_DIM -DROPE_HEADS -DROPE_ROWS -DROPE_SYMBOL (kernel_builder/externals.py)"
#endif
LLAMA_NPU_REQUIRE(ROPE_HEAD_DIM);
LLAMA_NPU_REQUIRE(ROPE_HEADS);
LLAMA_NPU_REQUIRE(ROPE_ROWS);
static_assert(ROPE_HEAD_DIM % 2 == 0, "ROPE_HEAD_DIM must be even");

static constexpr int kHalf = ROPE_HEAD_DIM / 2;
static constexpr int kWidth = ROPE_HEADS * ROPE_HEAD_DIM;

#if defined(__AIENGINE__)

// 32 lanes per half when the half allows it (head_dim 64, 128), else 16
static constexpr int kLanes = kHalf % 32 == 0 ? 32 : 16;
static_assert(kHalf % kLanes == 0, "ROPE_HEAD_DIM/2 must be a multiple of 16 on AIE2P");

extern "C" void ROPE_SYMBOL(bfloat16 *LLAMA_NPU_RESTRICT x, bfloat16 *LLAMA_NPU_RESTRICT lut,
                            bfloat16 *LLAMA_NPU_RESTRICT y) {
  ::aie::set_rounding(::aie::rounding_mode::conv_even);
  for (int r = 0; r < ROPE_ROWS; ++r) {
    const bfloat16 *LLAMA_NPU_RESTRICT cs = lut + r * ROPE_HEAD_DIM;
    for (int h = 0; h < ROPE_HEADS; ++h) {
      const bfloat16 *LLAMA_NPU_RESTRICT xh = x + r * kWidth + h * ROPE_HEAD_DIM;
      bfloat16 *LLAMA_NPU_RESTRICT yh = y + r * kWidth + h * ROPE_HEAD_DIM;
      for (int i = 0; i < kHalf; i += kLanes) {
        ::aie::vector<bfloat16, kLanes> x1 = ::aie::load_v<kLanes>(xh + i);
        ::aie::vector<bfloat16, kLanes> x2 = ::aie::load_v<kLanes>(xh + kHalf + i);
        ::aie::vector<bfloat16, kLanes> c = ::aie::load_v<kLanes>(cs + i);
        ::aie::vector<bfloat16, kLanes> s = ::aie::load_v<kLanes>(cs + kHalf + i);
        ::aie::accum<accfloat, kLanes> lo = ::aie::mul(x1, c);
        lo = ::aie::msc(lo, x2, s);  // x1*cos - x2*sin (msc avoids a bf16 vector negate)
        ::aie::accum<accfloat, kLanes> hi = ::aie::mul(x2, c);
        hi = ::aie::mac(hi, x1, s);  // x2*cos + x1*sin
        ::aie::store_v(yh + i, lo.template to_vector<bfloat16>());
        ::aie::store_v(yh + kHalf + i, hi.template to_vector<bfloat16>());
      }
    }
  }
}

#else

extern "C" void ROPE_SYMBOL(bfloat16 *LLAMA_NPU_RESTRICT x, bfloat16 *LLAMA_NPU_RESTRICT lut,
                            bfloat16 *LLAMA_NPU_RESTRICT y) {
  for (int r = 0; r < ROPE_ROWS; ++r) {
    const bfloat16 *cs = lut + static_cast<long>(r) * ROPE_HEAD_DIM;
    for (int h = 0; h < ROPE_HEADS; ++h) {
      const bfloat16 *xh = x + static_cast<long>(r) * kWidth + static_cast<long>(h) * ROPE_HEAD_DIM;
      bfloat16 *yh = y + static_cast<long>(r) * kWidth + static_cast<long>(h) * ROPE_HEAD_DIM;
      for (int i = 0; i < kHalf; ++i) {
        const float x1 = bf16_to_f32(xh[i]), x2 = bf16_to_f32(xh[kHalf + i]);
        const float c = bf16_to_f32(cs[i]), s = bf16_to_f32(cs[kHalf + i]);
        const float p1c = x1 * c, p2s = x2 * s, p2c = x2 * c, p1s = x1 * s;  // exact in f32
        yh[i] = f32_to_bf16(p1c - p2s);
        yh[kHalf + i] = f32_to_bf16(p2c + p1s);
      }
    }
  }
}

#endif
