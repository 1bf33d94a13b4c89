// The GEMM's output C written in block float (kernel_builder/gemm with c_format "bfp16"; included by gemm_bfp.cc
// after gemm.cc). Two more epilogue entry points of the same object, each writing the tile IN PLACE over the front
// of the f32 accumulator as 72-byte blocks, block-row major [TM/8][OUT_N/8] (OUT_N = TN, or TN/2 with the gated
// epilogue): block (mb, cb) = rows 8mb .. 8mb+7, columns 8cb .. 8cb+7 of the tile, per row r 9 bytes at 9r
// [E, m0 .. m7] (kernel_builder/block_float.py's at-rest layout, the weights' format: a C panel of them is
// exactly an activation at rest in block float, i8 [rows/8, 9 cols]).
//   outc(acc)   the values of out (bf16(acc), RNE), then block float
//   gluc(acc)   the values of glu (silu(bf16(gate)) * bf16(up), rounded to bf16), then block float
// Numerics: each value is rounded f32 -> bf16 (RNE) exactly as out / glu do, then every 8 consecutive values of a
// row share the exponent of their largest magnitude with round-half-even 8-bit mantissas (block_float.encode,
// kernel_builder.numerics.to_bfp16ebs8: the conversion gemm.cc's mac applies to a bf16 A tile), so the bytes are
// block_float.encode of the bf16 tile the bf16 epilogues write.
// In place: output block i (bytes [72 i, 72 i + 72)) is written after the accumulator blocks it comes from (f32
// block i at bytes [256 i, +256), glu: blocks 2i and 2i + 1 at [512 i, +512)) are read, and below every
// accumulator block not yet read (72 (i + 1) <= 256 (i + 1)).
#pragma once

#if !defined(GEMM_OUTC_SYMBOL) || !defined(GEMM_GLUC_SYMBOL)
#error "compile with -DGEMM_OUTC_SYMBOL=... -DGEMM_GLUC_SYMBOL=... (kernel_builder/gemm/external.py)"
#endif

#if defined(__AIENGINE__)

// 64 bf16 values (one 8x8 block, rows of 8) -> one block-float block, the conversion of gemm.cc's to_bfp
static inline Bfp bfp_of(::aie::vector<bfloat16, kBlockElems> v) {
  ::aie::accum<accfloat, kBlockElems> wide;
  wide.from_vector(v);
  return wide.template to_vector<bfp16ebs8>();
}

extern "C" void GEMM_OUTC_SYMBOL(bfloat16 *acc_bytes) {
  ::aie::set_rounding(::aie::rounding_mode::conv_even);
  const float *acc = reinterpret_cast<const float *>(acc_bytes);
  BfpOut out(reinterpret_cast<bfp16ebs8 *>(acc_bytes));
  for (int b = 0; b < kMB * kNB; ++b) {
    const int i = b * kBlockElems;
    out << bfp_of(::aie::concat(acc_bf16(acc, i), acc_bf16(acc, i + kLanes)));
  }
}

extern "C" void GEMM_GLUC_SYMBOL(bfloat16 *acc_bytes) {
  ::aie::set_rounding(::aie::rounding_mode::conv_even);
  const float *acc = reinterpret_cast<const float *>(acc_bytes);
  const GluConsts g = glu_consts();
  BfpOut out(reinterpret_cast<bfp16ebs8 *>(acc_bytes));
  for (int b = 0; b < kMB * kHalfNB; ++b) {   // output block b = (mb, nb): gate block 2b, up block 2b + 1
    const int gi = 2 * b * kBlockElems;
    out << bfp_of(::aie::concat(glu_lanes(acc, gi, g), glu_lanes(acc, gi + kLanes, g)));
  }
}

#else  // host scalar path: the bf16 values of out / glu, then block_float.encode's rounding, group by group

// one row of 8 values (bf16 values in f32) -> [E, m0 .. m7]: E = floor(log2 max|x|) raised to -127 (0 for an
// all-zero row), m = round-half-even(x / 2^(E-6)) clipped to [-128, 127]
static inline void bfp_encode_row(const float *x, uint8_t *out) {
  float amax = 0.0f;
  for (int i = 0; i < kBlock; ++i) amax = std::fabs(x[i]) > amax ? std::fabs(x[i]) : amax;
  int e = -127;
  if (amax > 0.0f) {
    std::frexp(amax, &e);
    e = e - 1 < -127 ? -127 : e - 1;
  }
  out[0] = static_cast<uint8_t>(e + 127);
  for (int i = 0; i < kBlock; ++i) {
    double m = std::nearbyint(std::ldexp(static_cast<double>(x[i]), 6 - e));   // ties to even (default mode)
    m = m > 127.0 ? 127.0 : (m < -128.0 ? -128.0 : m);
    out[1 + i] = static_cast<uint8_t>(static_cast<int8_t>(m));
  }
}

static inline void bfp_encode_block(const float *v, uint8_t *dst) {   // 64 values, rows of 8 -> 72 bytes
  for (int r = 0; r < kBlock; ++r) bfp_encode_row(v + r * kBlock, dst + 9 * r);
}

extern "C" void GEMM_OUTC_SYMBOL(bfloat16 *acc_bytes) {
  const float *acc = reinterpret_cast<const float *>(acc_bytes);
  uint8_t *dst = reinterpret_cast<uint8_t *>(acc_bytes);
  float v[kBlockElems];
  for (int b = 0; b < kMB * kNB; ++b) {
    for (int e = 0; e < kBlockElems; ++e) v[e] = bf16_to_f32(f32_to_bf16(acc[b * kBlockElems + e]));
    bfp_encode_block(v, dst + 72 * b);
  }
}

extern "C" void GEMM_GLUC_SYMBOL(bfloat16 *acc_bytes) {
  const float *acc = reinterpret_cast<const float *>(acc_bytes);
  uint8_t *dst = reinterpret_cast<uint8_t *>(acc_bytes);
  float v[kBlockElems];
  for (int b = 0; b < kMB * kHalfNB; ++b) {
    for (int e = 0; e < kBlockElems; ++e) {
      const int gi = 2 * b * kBlockElems + e;   // gate block 2b, up block 2b + 1
      const float g = bf16_to_f32(f32_to_bf16(acc[gi]));
      const float u = bf16_to_f32(f32_to_bf16(acc[gi + kBlockElems]));
      const float silu = g / (1.0f + std::exp(-g));
      v[e] = bf16_to_f32(f32_to_bf16(silu * u));
    }
    bfp_encode_block(v, dst + 72 * b);
  }
}

#endif
