// Host aie_api, part 4: aie::mmul for bfloat16 x bfloat16 on AIE2P, both implementations aie_api selects:
//  * default: 4x8x8 = one call of the element-wise emulation (aie_api aie2p/emulated_mmul_intrinsics.hpp:236,
//    mac_4x8_8x8_bf16: 9 shuffles, 16 broadcasts, 8 element-wise 32-lane MACs, k ascending, f32 accumulation);
//    8x8x8 = two of them (aie2p/mmul_bf16_bf16.hpp:135-155).
//  * AIE_API_EMULATE_BFLOAT16_MMUL_WITH_BFP16: A and B^T converted to block float (bfp16ebs8) and one 8x8x8
//    block-float MAC (aie2p/mmul_bf16_bf16.hpp:63-131); a 4x8x8 uses the same instruction on a grown A
//    (C_block_larger_internal, aie_api detail/mmul.hpp:510).
// Shapes aie_api provides for bf16 x bf16 on XDNA 2 (detail/mmul.hpp:91): 8x8x4, 4x8x8, 4x8x4, 8x8x8, 8x1x8;
// the kernels use 4x8x8 and 8x8x8, which are the ones modelled. Any other shape is a compile error.
#pragma once

#include "arith.hpp"
#include "block_float.hpp"

#ifndef AIE_API_EMULATE_BFLOAT16_MMUL_WITH_BFP16
#define AIE_API_EMULATE_BFLOAT16_MMUL_WITH_BFP16 0
#endif

namespace aie {

template <unsigned M, unsigned K, unsigned N, typename TA, typename TB = TA, typename Tag = accauto>
struct mmul {
  static_assert(std::is_same_v<TA, bfloat16> && std::is_same_v<TB, bfloat16>,
                "aie_api_host: only bfloat16 x bfloat16 mmul is modelled (the kernels use no other)");
  static_assert(std::is_same_v<Tag, accauto> || std::is_same_v<Tag, accfloat>,
                "aie::mmul<bf16, bf16>: AIE2P accumulates bf16 products in accfloat (32-bit) only");
  static_assert((M == 8 && K == 8 && N == 4) || (M == 4 && K == 8 && N == 4) || (M == 4 && K == 8 && N == 8) ||
                    (M == 8 && K == 8 && N == 8) || (M == 8 && K == 1 && N == 8),
                "aie::mmul<M, K, N, bfloat16, bfloat16>: not an AIE2P shape (aie_api detail/mmul.hpp:91 lists "
                "8x8x4, 4x8x8, 4x8x4, 8x8x8, 8x1x8)");
  static_assert((M == 4 || M == 8) && K == 8 && N == 8,
                "aie_api_host: of the AIE2P bf16 shapes only 4x8x8 and 8x8x8 are modelled");
  static_assert(AIE_API_EMULATE_BFLOAT16_MMUL_WITH_BFP16 == 0 || AIE_API_EMULATE_BFLOAT16_MMUL_WITH_BFP16 == 1,
                "AIE_API_EMULATE_BFLOAT16_MMUL_WITH_BFP16 must be 0 or 1");

  static constexpr unsigned size_A = M * K, size_B = K * N, size_C = M * N;
  static constexpr bool kBfp = AIE_API_EMULATE_BFLOAT16_MMUL_WITH_BFP16 == 1;
  using accum_type = accum<accfloat, size_C>;

  float c[size_C];
  bool zero = true;  // default-constructed: the first mul/mac treats C as zero (aie_api aie.hpp:5908)

  mmul() = default;
  template <typename T>
  mmul(const vector<T, size_C> &v) : zero(false) {  // aie.hpp:5967: C from a row-major vector
    for (unsigned i = 0; i < size_C; ++i) c[i] = widen(v.d[i]);
  }
  mmul(const accum_type &a) : zero(false) {
    for (unsigned i = 0; i < size_C; ++i) c[i] = a.d[i];
  }

  void mac(const vector<bfloat16, size_A> &a, const vector<bfloat16, size_B> &b) { step(a, b, true); }
  void mul(const vector<bfloat16, size_A> &a, const vector<bfloat16, size_B> &b) { step(a, b, false); }

  accum_type to_accum() const {
    accum_type r;
    for (unsigned i = 0; i < size_C; ++i) r.d[i] = c[i];
    return r;
  }
  template <typename T>
  vector<T, size_C> to_vector() const {
    return to_accum().template to_vector<T>();
  }

 private:
  static float widen(bfloat16 v) { return static_cast<float>(v); }
  static float widen(float v) { return v; }

  void step(const vector<bfloat16, size_A> &a, const vector<bfloat16, size_B> &b, bool accumulate) {
    if (!accumulate || zero)
      for (unsigned i = 0; i < size_C; ++i) c[i] = 0.0f;
    zero = false;
    if constexpr (kBfp)
      step_bfp(a, b);
    else
      for (unsigned h = 0; h < M / 4; ++h) step_emulated(a, b, h);
  }

  // mac_4x8_8x8_bf16 on rows [4h, 4h+4): for k = 0..7, C += a[:, k] (x) b[k, :], each product exact, one f32 add
  void step_emulated(const vector<bfloat16, size_A> &a, const vector<bfloat16, size_B> &b, unsigned h) {
    using namespace aie_host;
    count(k_mmul_bf16_4x8x8_emulated);
    count(k_shuffle, 9);
    count(k_broadcast, 16);
    count(k_vmac_bf16, 8);
    for (unsigned k = 0; k < K; ++k)
      for (unsigned i = 4 * h; i < 4 * h + 4; ++i)
        for (unsigned j = 0; j < N; ++j) c[i * N + j] += widen(a.d[i * K + k]) * widen(b.d[k * N + j]);
  }

  // A's rows and B's columns become bfp16 blocks of 8 along K; each 8-term block dot product is exact (8-bit
  // mantissas, a power-of-two scale) and is added to C with one f32 rounding. ASSUMPTION (docs/aie-api-host.md).
  void step_bfp(const vector<bfloat16, size_A> &a, const vector<bfloat16, size_B> &b) {
    using namespace aie_host;
    count(k_mmul_bfp16_8x8x8);
    count(k_bfp16_convert, 2);
    count(k_shuffle);                       // B transposed to 8x8T
    count(k_vconvert, M == 8 ? 1 : 2);      // A (and for 4x8x8 B) widened to accfloat
    if constexpr (M == 8) count(k_vmac_bf16);  // 8x8x8: B widened by a multiply with ones
    float qa[M][8], qb[N][8], col[8];
    for (unsigned i = 0; i < M; ++i) {
      float row[8];
      for (unsigned k = 0; k < 8; ++k) row[k] = widen(a.d[i * K + k]);
      to_bfp16_block(row, qa[i]);
    }
    for (unsigned j = 0; j < N; ++j) {
      for (unsigned k = 0; k < 8; ++k) col[k] = widen(b.d[k * N + j]);
      to_bfp16_block(col, qb[j]);
    }
    for (unsigned i = 0; i < M; ++i)
      for (unsigned j = 0; j < N; ++j) {
        double dot = 0.0;  // exact: 8 products of 8-bit mantissas
        for (unsigned k = 0; k < 8; ++k) dot += static_cast<double>(qa[i][k]) * qb[j][k];
        c[i * N + j] = static_cast<float>(static_cast<double>(c[i * N + j]) + dot);
      }
  }
};


// aie::mmul<8, 8, 8, bfp16ebs8, bfp16ebs8> (aie_api aie2p/mmul_bfp16_bfp16.hpp:17-36): both operands already block
// vectors; mac/mul issue one mac_8x8_8x8T_conf / mul_8x8_8x8T, whose B operand is B TRANSPOSED, i.e. [N][K]
// row-major (the "8x8T"): row j of b holds the 8 K values of output column j, one bfp16 block. No conversion,
// no transpose: the caller converts each operand once (accum::to_vector<bfp16ebs8>) and may reuse it.
template <typename Tag>
struct mmul<8, 8, 8, bfp16ebs8, bfp16ebs8, Tag> {
  static_assert(std::is_same_v<Tag, accauto> || std::is_same_v<Tag, accfloat>,
                "aie::mmul<bfp16ebs8, bfp16ebs8>: AIE2P accumulates block-float products in accfloat only");
  static constexpr unsigned size_A = 64, size_B = 64, size_C = 64;
  using accum_type = accum<accfloat, size_C>;
  using block_type = block_vector<bfp16ebs8, 64>;

  float c[size_C];
  bool zero = true;

  mmul() = default;
  template <typename T>
  mmul(const vector<T, size_C> &v) : zero(false) {
    for (unsigned i = 0; i < size_C; ++i) c[i] = aie_host::widen(v.d[i]);
  }
  mmul(const accum_type &a) : zero(false) {
    for (unsigned i = 0; i < size_C; ++i) c[i] = a.d[i];
  }

  void mac(const block_type &a, const block_type &bt) { step(a, bt, true); }
  void mul(const block_type &a, const block_type &bt) { step(a, bt, false); }

  accum_type to_accum() const {
    accum_type r;
    for (unsigned i = 0; i < size_C; ++i) r.d[i] = c[i];
    return r;
  }
  template <typename T>
  vector<T, size_C> to_vector() const {
    return to_accum().template to_vector<T>();
  }

 private:
  // C[i][j] += sum_k a[i][k] * bt[j][k]: each 8-term block dot product exact, added with one f32 rounding
  // (the same arithmetic as the bf16 mmul's block-float path after its conversions)
  void step(const block_type &a, const block_type &bt, bool accumulate) {
    aie_host::count(aie_host::k_mmul_bfp16_8x8x8);
    if (!accumulate || zero)
      for (unsigned i = 0; i < size_C; ++i) c[i] = 0.0f;
    zero = false;
    for (unsigned i = 0; i < 8; ++i)
      for (unsigned j = 0; j < 8; ++j) {
        double dot = 0.0;
        for (unsigned k = 0; k < 8; ++k) dot += static_cast<double>(a.q[i * 8 + k]) * bt.q[j * 8 + k];
        c[i * 8 + j] = static_cast<float>(static_cast<double>(c[i * 8 + j]) + dot);
      }
  }
};

}  // namespace aie
