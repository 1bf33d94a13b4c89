// GEMM micro-kernel with a 4-bit weight tile (kernel_builder/gemm_q4): the W slice arrives as the q4 codes, scales
// and mins of TN rows over TK columns and is dequantized in L1 into the 8x8-blocked bf16 W tile that gemm.cc's
// mac multiplies, then that mac runs: acc += a . dequant(wq)^T.
//
// The dequantization is dequant_q4.cc's (w = bf16_rne(d * q + m) in f32, unsigned codes), so the product is the
// one of dequant_q4 + gemm on the same rows, bit for bit. The W slice (i8, the L1 layout the memory-tile DMA of
// kernel_builder/gemm_q4/builder.py builds):
//   codes   [TN][TK/2] bytes   row n: its TK codes, element 2i in the low nibble of byte i (the q4 row order)
//   sm      [TN][2][TK/G] bf16 row n: its TK/G scales, then its TK/G mins
// wst: the dequantized tile, [TN/8][TK/8][8][8] bf16 (the w operand of gemm.cc's mac).
//
// Compiled with gemm.cc's -DGEMM_* defines (this file includes it: one object holds the zero / mac / out entry
// points and this one) and -DGQ4_G (group) -DGQ4_SYMBOL=gemm_q4_mac_bf16_m<M>_k<K>_n<N>_g<G>.
#include "gemm.cc"

#if !defined(GQ4_G) || !defined(GQ4_SYMBOL)
#error "compile with -DGQ4_G -DGQ4_SYMBOL (kernel_builder/gemm_q4/external.py)"
#endif
LLAMA_NPU_REQUIRE(GQ4_G);
static_assert(GEMM_TILE_K % GQ4_G == 0 || GQ4_G % GEMM_TILE_K == 0, "a slice covers whole groups");
static_assert(GEMM_TILE_K % (2 * GQ4_G) == 0, "a row's scales of one slice are whole 32-bit words");

static constexpr int kQGroups = GEMM_TILE_K / GQ4_G;           // groups of one row in the slice
static constexpr int kCodeBytes = GEMM_TILE_N * GEMM_TILE_K / 2;
static constexpr int kRowCodes = GEMM_TILE_K / 2;               // code bytes of one row

#if defined(__AIENGINE__)

// Per row, per 32 codes (one 128-bit uint4 vector): load, unpack to uint8, to_float (exact), d * q + m in accfloat,
// one RNE rounding (dequant_q4.cc's steps), then the 32 bf16 lanes go to the four 8x8 blocks they belong to (row
// n % 8 of blocks (n / 8, c / 8 .. c / 8 + 3)) as four 8-lane stores.
static constexpr int kQLanes = 32;
static_assert(GQ4_G % kQLanes == 0, "GQ4_G must be a multiple of 32 on AIE2P");
static_assert(kRowCodes % 16 == 0, "each row's codes start 16-byte aligned");

static inline void dequant_tile(const uint8_t *LLAMA_NPU_RESTRICT wq, bfloat16 *LLAMA_NPU_RESTRICT wst) {
  for (int n = 0; n < GEMM_TILE_N; ++n) {
    const uint8_t *LLAMA_NPU_RESTRICT codes = wq + n * kRowCodes;
    const bfloat16 *LLAMA_NPU_RESTRICT sc = reinterpret_cast<const bfloat16 *>(wq + kCodeBytes) + n * 2 * kQGroups;
    bfloat16 *LLAMA_NPU_RESTRICT row = wst + (n / kBlock) * kKB * kBlockElems + (n % kBlock) * kBlock;
    for (int g = 0; g < kQGroups; ++g) {
      const bfloat16 d = sc[g];
      const ::aie::vector<bfloat16, kQLanes> z = ::aie::broadcast<bfloat16, kQLanes>(sc[kQGroups + g]);
      for (int c = g * GQ4_G; c < (g + 1) * GQ4_G; c += kQLanes) {
        const auto q = ::aie::unpack(::aie::load_v<kQLanes>(reinterpret_cast<const uint4 *>(codes + c / 2)));
        ::aie::accum<accfloat, kQLanes> t = ::aie::mul(::aie::to_float<bfloat16>(q), d);
        t = ::aie::add(t, z);
        const ::aie::vector<bfloat16, kQLanes> v = t.template to_vector<bfloat16>();
        for (int b = 0; b < kQLanes / kBlock; ++b)
          ::aie::store_v(row + (c / kBlock + b) * kBlockElems, v.template extract<kBlock>(b));
      }
    }
  }
}

#else  // host scalar path: the same dequantization, element by element

static inline void dequant_tile(const uint8_t *LLAMA_NPU_RESTRICT wq, bfloat16 *LLAMA_NPU_RESTRICT wst) {
  for (int n = 0; n < GEMM_TILE_N; ++n)
    for (int k = 0; k < GEMM_TILE_K; ++k) {
      const int q = (wq[n * kRowCodes + k / 2] >> (4 * (k % 2))) & 0xF;
      bfloat16 sc, mn;
      std::memcpy(&sc, wq + kCodeBytes + 2 * (n * 2 * kQGroups + k / GQ4_G), 2);
      std::memcpy(&mn, wq + kCodeBytes + 2 * (n * 2 * kQGroups + kQGroups + k / GQ4_G), 2);
      const float v = bf16_to_f32(sc) * static_cast<float>(q) + bf16_to_f32(mn);
      wst[((n / kBlock) * kKB + k / kBlock) * kBlockElems + (n % kBlock) * kBlock + k % kBlock] = f32_to_bf16(v);
    }
}

#endif

extern "C" void GQ4_SYMBOL(bfloat16 *LLAMA_NPU_RESTRICT a, uint8_t *LLAMA_NPU_RESTRICT wq,
                           bfloat16 *LLAMA_NPU_RESTRICT acc_bytes, bfloat16 *LLAMA_NPU_RESTRICT scratch,
                           bfloat16 *LLAMA_NPU_RESTRICT wst) {
#if defined(__AIENGINE__)
  ::aie::set_rounding(::aie::rounding_mode::conv_even);
#endif
  dequant_tile(wq, wst);
  GEMM_MAC_SYMBOL(a, wst, acc_bytes, scratch);
}
