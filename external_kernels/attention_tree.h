// The 8-row reduction tree of external_kernels/attention.cc's AIE2P vector path, included by it inside its
// __AIENGINE__ region after its shared helpers (kLanes, kDotLanes, kHd, vadd): the prefill's row maxima and sums
// (attention_prefill.h softmax8) and the decode's dot products of 8 keys (dots8, used at ATTN_MODE 2 and 3).
#pragma once

// The 8-row reduction tree: lanes [0, 8) = op over each of 8 rows' 16 partials (max, or an f32 sum), without a
// reduction per row: three halving steps, each pairing 8-lane halves (a register concat, no instruction) after a
// 16-lane transpose (one shuffle), with the rows paired so that lane i ends as row i (AIE2P transposes 32-bit 2x8,
// 4x4 and 8x2 in one shuffle: aie_api detail/aie2/transpose.hpp). 9 ops + 7 shuffles for 8 rows instead of 8
// reductions (prefill: the rows' maxima and sums; decode: 8 keys' dot products). The caller takes level 1 as each
// pair of rows is ready (pair_halves of rows kTreeA[p] and kTreeB[p] into g_tree_w), then reduce8_tail.
static constexpr int kTreeA[4] = {0, 1, 4, 5}, kTreeB[4] = {2, 3, 6, 7};   // the rows level 1 pairs
// The tree's level-1 vectors (4 x 16 floats) in core data memory: the call chain keeps no array on its stack.
alignas(::aie::vector_decl_align) static float g_tree_w[4 * kLanes];

struct MaxOp {
  template <unsigned N>
  ::aie::vector<float, N> operator()(const ::aie::vector<float, N> &a, const ::aie::vector<float, N> &b) const {
    return ::aie::max(a, b);
  }
};
struct AddOp {   // f32 adds through the accumulator, as vadd
  template <unsigned N>
  ::aie::vector<float, N> operator()(const ::aie::vector<float, N> &a, const ::aie::vector<float, N> &b) const {
    ::aie::accum<accfloat, N> x, y;
    x.from_vector(a);
    y.from_vector(b);
    return ::aie::add(x, y).template to_vector<float>();
  }
};

// lanes [0, 8) / [8, 16) of x and y, paired: op(concat(x_lo, y_lo), concat(x_hi, y_hi)) (halves of a pair of rows)
template <typename Op>
static inline ::aie::vector<float, kLanes> pair_halves(const ::aie::vector<float, kLanes> &x,
                                                       const ::aie::vector<float, kLanes> &y, Op op) {
  return op(::aie::concat(x.template extract<8>(0), y.template extract<8>(0)),
            ::aie::concat(x.template extract<8>(1), y.template extract<8>(1)));
}

// levels 2 and 3 of the tree from its level-1 vectors in g_tree_w (vector p: lanes [0, 8) row kTreeA[p], [8, 16)
// row kTreeB[p]; 8 partials each)
template <typename Op>
static inline ::aie::vector<float, 8> reduce8_tail(Op op) {
  const ::aie::vector<float, kLanes> x0 =   // 4 partials of 4 rows
      pair_halves(::aie::transpose(::aie::load_v<kLanes>(g_tree_w), 2, 8),
                  ::aie::transpose(::aie::load_v<kLanes>(g_tree_w + kLanes), 2, 8), op);
  const ::aie::vector<float, kLanes> x1 =
      pair_halves(::aie::transpose(::aie::load_v<kLanes>(g_tree_w + 2 * kLanes), 2, 8),
                  ::aie::transpose(::aie::load_v<kLanes>(g_tree_w + 3 * kLanes), 2, 8), op);
  const ::aie::vector<float, kLanes> u0 = ::aie::transpose(x0, 4, 4), u1 = ::aie::transpose(x1, 4, 4);
  const ::aie::vector<float, kLanes> y =   // 2 partials of 8 rows
      ::aie::concat(op(u0.template extract<8>(0), u0.template extract<8>(1)),
                    op(u1.template extract<8>(0), u1.template extract<8>(1)));
  const ::aie::vector<float, kLanes> z = ::aie::transpose(y, 8, 2);
  return op(z.template extract<8>(0), z.template extract<8>(1));
}

// key row kr's 32-lane dot-product partials with q, folded to 16 lanes in the accumulator
static inline ::aie::accum<accfloat, kLanes> dot16(const bfloat16 *LLAMA_NPU_RESTRICT q, const bfloat16 *LLAMA_NPU_RESTRICT kr) {
  ::aie::accum<accfloat, kDotLanes> dot = ::aie::mul(::aie::load_v<kDotLanes>(q), ::aie::load_v<kDotLanes>(kr));
  for (int d = kDotLanes; d < kHd; d += kDotLanes)
    dot = ::aie::mac(dot, ::aie::load_v<kDotLanes>(q + d), ::aie::load_v<kDotLanes>(kr + d));
  return ::aie::add(dot.template extract<kLanes>(0), dot.template extract<kLanes>(1));
}

// Lanes [0, 8): the dot products q . k_u of 8 consecutive keys (rows of k), f32 sums of exact bf16 products: each
// key's 32-lane partials folded to 16 in the accumulator, pairs of keys' halves added there too (tree level 1),
// then levels 2 and 3 of the reduction tree; no reduction per key.
static inline ::aie::vector<float, 8> dots8(const bfloat16 *LLAMA_NPU_RESTRICT q, const bfloat16 *LLAMA_NPU_RESTRICT k) {
  for (int p = 0; p < 4; ++p) {   // tree level 1 in the accumulator: keys kTreeA[p] and kTreeB[p]
    const ::aie::accum<accfloat, kLanes> ha = dot16(q, k + kTreeA[p] * kHd), hb = dot16(q, k + kTreeB[p] * kHd);
    ::aie::store_v(g_tree_w + p * kLanes,
                   ::aie::add(::aie::concat(ha.template extract<8>(0), hb.template extract<8>(0)),
                              ::aie::concat(ha.template extract<8>(1), hb.template extract<8>(1)))
                       .template to_vector<float>());
  }
  return reduce8_tail(AddOp{});
}
