// Half-split RoPE (HF rotate_half convention) of one position row.
//   x[n_heads * ROPE_HEAD_DIM], lut[ROPE_HEAD_DIM] = [cos(p*f_0..f_{h-1}) | sin(p*f_0..f_{h-1})], h = head_dim/2
//   y1 = x1*cos - x2*sin,  y2 = x2*cos + x1*sin   (per head; x1 = first half, x2 = second half)
// Products of two bf16 values are exact in f32, so each output is one f32 add/sub then one bf16 RNE rounding:
// the same value the numpy reference produces.
#include "kernel_common.h"

#if !defined(ROPE_HEAD_DIM) || !defined(ROPE_SYMBOL)
#error "compile with -DROPE_HEAD_DIM=<head_dim> -DROPE_SYMBOL=<name> (kernel_builder/externals.py)"
#endif
LLAMA_NPU_REQUIRE(ROPE_HEAD_DIM);
static_assert(ROPE_HEAD_DIM % 2 == 0, "ROPE_HEAD_DIM must be even");

static constexpr int kHalf = ROPE_HEAD_DIM / 2;

#if defined(__AIENGINE__)

static constexpr int kLanes = 16;
static_assert(kHalf % kLanes == 0, "ROPE_HEAD_DIM/2 must be a multiple of 16 on AIE2P");

extern "C" void ROPE_SYMBOL(bfloat16 *LLAMA_NPU_RESTRICT x, bfloat16 *LLAMA_NPU_RESTRICT lut,
                            bfloat16 *LLAMA_NPU_RESTRICT y, int32_t n_heads) {
  ::aie::set_rounding(::aie::rounding_mode::conv_even);
  for (int h = 0; h < n_heads; ++h) {
    const bfloat16 *LLAMA_NPU_RESTRICT xh = x + h * ROPE_HEAD_DIM;
    bfloat16 *LLAMA_NPU_RESTRICT yh = y + h * ROPE_HEAD_DIM;
    for (int i = 0; i < kHalf; i += kLanes) {
      ::aie::vector<bfloat16, kLanes> x1 = ::aie::load_v<kLanes>(xh + i);
      ::aie::vector<bfloat16, kLanes> x2 = ::aie::load_v<kLanes>(xh + kHalf + i);
      ::aie::vector<bfloat16, kLanes> c = ::aie::load_v<kLanes>(lut + i);
      ::aie::vector<bfloat16, kLanes> s = ::aie::load_v<kLanes>(lut + kHalf + i);
      ::aie::accum<accfloat, kLanes> lo = ::aie::mul(x1, c);
      lo = ::aie::msc(lo, x2, s);  // x1*cos - x2*sin (msc avoids a bf16 vector negate)
      ::aie::accum<accfloat, kLanes> hi = ::aie::mul(x2, c);
      hi = ::aie::mac(hi, x1, s);  // x2*cos + x1*sin
      ::aie::store_v(yh + i, lo.template to_vector<bfloat16>());
      ::aie::store_v(yh + kHalf + i, hi.template to_vector<bfloat16>());
    }
  }
}

#else

extern "C" void ROPE_SYMBOL(bfloat16 *LLAMA_NPU_RESTRICT x, bfloat16 *LLAMA_NPU_RESTRICT lut,
                            bfloat16 *LLAMA_NPU_RESTRICT y, int32_t n_heads) {
  for (int h = 0; h < n_heads; ++h) {
    const bfloat16 *xh = x + static_cast<long>(h) * ROPE_HEAD_DIM;
    bfloat16 *yh = y + static_cast<long>(h) * ROPE_HEAD_DIM;
    for (int i = 0; i < kHalf; ++i) {
      const float x1 = bf16_to_f32(xh[i]), x2 = bf16_to_f32(xh[kHalf + i]);
      const float c = bf16_to_f32(lut[i]), s = bf16_to_f32(lut[kHalf + i]);
      const float p1c = x1 * c, p2s = x2 * s, p2c = x2 * c, p1s = x1 * s;  // exact in f32
      yh[i] = f32_to_bf16(p1c - p2s);
      yh[kHalf + i] = f32_to_bf16(p2c + p1s);
    }
  }
}

#endif
