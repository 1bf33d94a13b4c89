// Flash-attention primitives (online softmax) for one head and one query tile.
//   q [ATTN_LQ][ATTN_HEAD_DIM], k/v [ATTN_LK][ATTN_HEAD_DIM] bf16; running state m[ATTN_LQ] (max),
//   l[ATTN_LQ] (sum of exp), acc[ATTN_LQ][ATTN_HEAD_DIM] (unnormalised output), all f32.
//   init:   m = lowest finite f32, l = 0, acc = 0
//   step:   s = (q . k^T) * ATTN_SCALE in f32; with causal != 0, key position k_pos0+j > query position
//           q_pos0+i is excluded; then m' = max(m, max_j s), alpha = exp(m - m'), l = alpha*l + sum_j exp(s-m'),
//           acc = alpha*acc + sum_j exp(s-m') v_j. A row whose keys are all masked in this tile is unchanged.
//   finish: out = acc / l (bf16 RNE), rows with l == 0 -> 0.
// ATTN_SCALE is 1/sqrt(head_dim) rounded to f32, passed as a hex float literal so both builds use the same bits.
#include "kernel_common.h"

#if !defined(ATTN_HEAD_DIM) || !defined(ATTN_LQ) || !defined(ATTN_LK) || !defined(ATTN_SCALE) || \
    !defined(ATTN_INIT_SYMBOL) || !defined(ATTN_STEP_SYMBOL) || !defined(ATTN_FINISH_SYMBOL)
#error "compile with the -DATTN_* defines from kernel_builder/externals.py"
#endif
LLAMA_NPU_REQUIRE(ATTN_HEAD_DIM);
LLAMA_NPU_REQUIRE(ATTN_LQ);
LLAMA_NPU_REQUIRE(ATTN_LK);

static constexpr float kLowest = -0x1.fffffep127f;  // "no key seen yet"; exp(kLowest - m') == 0
static constexpr float kScale = ATTN_SCALE;

static inline bool attn_masked(int32_t causal, int32_t q_pos, int32_t k_pos) { return causal && k_pos > q_pos; }

#if defined(__AIENGINE__)

// Vectorised: the O(lq*lk*hd) work (q.k dot products and the p.V accumulation) and exp run on the vector
// unit; the O(lq*lk) bookkeeping (mask, max) is scalar. exp uses aie::exp2 (bf16 result), so probabilities
// carry bf16 precision -- the vector path's only deviation from the f32 contract.
static constexpr int kDotLanes = 32;
static constexpr int kLanes = 16;
static constexpr float kLog2e = 1.4426950408889634f;
// exp(-80) ~ 2e-35: numerically zero next to any unmasked probability, and exp2's argument stays normal.
static constexpr float kMaskedArg = -80.0f;
static_assert(ATTN_HEAD_DIM % kDotLanes == 0, "ATTN_HEAD_DIM must be a multiple of 32 on AIE2P");
static_assert(ATTN_LK % kLanes == 0, "ATTN_LK must be a multiple of 16 on AIE2P");

extern "C" void ATTN_INIT_SYMBOL(float *LLAMA_NPU_RESTRICT m, float *LLAMA_NPU_RESTRICT l,
                                 float *LLAMA_NPU_RESTRICT acc) {
  for (int i = 0; i < ATTN_LQ; ++i) {
    m[i] = kLowest;
    l[i] = 0.0f;
  }
  for (int i = 0; i < ATTN_LQ * ATTN_HEAD_DIM; i += kLanes) ::aie::store_v(acc + i, ::aie::zeros<float, kLanes>());
}

extern "C" void ATTN_STEP_SYMBOL(bfloat16 *LLAMA_NPU_RESTRICT q, bfloat16 *LLAMA_NPU_RESTRICT k,
                                 bfloat16 *LLAMA_NPU_RESTRICT v, float *LLAMA_NPU_RESTRICT m,
                                 float *LLAMA_NPU_RESTRICT l, float *LLAMA_NPU_RESTRICT acc, int32_t q_pos0,
                                 int32_t k_pos0, int32_t causal) {
  ::aie::set_rounding(::aie::rounding_mode::conv_even);
  alignas(::aie::vector_decl_align) float s[ATTN_LK];
  alignas(::aie::vector_decl_align) bfloat16 p[ATTN_LK];
  for (int i = 0; i < ATTN_LQ; ++i) {
    const int32_t q_pos = q_pos0 + i;
    const bfloat16 *LLAMA_NPU_RESTRICT qi = q + i * ATTN_HEAD_DIM;
    float row_max = kLowest;
    bool any = false;
    for (int j = 0; j < ATTN_LK; ++j) {
      if (attn_masked(causal, q_pos, k_pos0 + j)) continue;
      const bfloat16 *LLAMA_NPU_RESTRICT kj = k + j * ATTN_HEAD_DIM;
      ::aie::accum<accfloat, kDotLanes> dot = ::aie::zeros<accfloat, kDotLanes>();
      for (int d = 0; d < ATTN_HEAD_DIM; d += kDotLanes)
        dot = ::aie::mac(dot, ::aie::load_v<kDotLanes>(qi + d), ::aie::load_v<kDotLanes>(kj + d));
      s[j] = ::aie::reduce_add(dot.template to_vector<float>()) * kScale;
      row_max = any ? (s[j] > row_max ? s[j] : row_max) : s[j];
      any = true;
    }
    if (!any) continue;
    const float m_new = m[i] > row_max ? m[i] : row_max;
    // exp(x) = exp2(x*log2e); masked keys get kMaskedArg so their probability is ~0.
    for (int j = 0; j < ATTN_LK; ++j) s[j] = attn_masked(causal, q_pos, k_pos0 + j) ? kMaskedArg : s[j] - m_new;
    const ::aie::vector<bfloat16, kLanes> ones = ::aie::broadcast<bfloat16, kLanes>(static_cast<bfloat16>(1.0f));
    ::aie::accum<accfloat, kLanes> l_acc = ::aie::zeros<accfloat, kLanes>();
    for (int j = 0; j < ATTN_LK; j += kLanes) {
      ::aie::accum<accfloat, kLanes> arg = ::aie::mul(::aie::load_v<kLanes>(s + j), kLog2e);
      ::aie::vector<bfloat16, kLanes> pj = ::aie::exp2<bfloat16>(arg.template to_vector<float>());
      ::aie::store_v(p + j, pj);
      l_acc = ::aie::mac(l_acc, pj, ones);  // sum of p in f32
    }
    const float diff = m[i] - m_new < kMaskedArg ? kMaskedArg : m[i] - m_new;
    ::aie::accum<accfloat, kLanes> alpha_arg = ::aie::mul(::aie::broadcast<float, kLanes>(diff), kLog2e);
    ::aie::accum<accfloat, kLanes> alpha_acc;
    alpha_acc.from_vector(::aie::exp2<bfloat16>(alpha_arg.template to_vector<float>()));
    const float alpha = alpha_acc.template to_vector<float>().get(0);
    l[i] = alpha * l[i] + ::aie::reduce_add(l_acc.template to_vector<float>());
    m[i] = m_new;
    float *LLAMA_NPU_RESTRICT acc_i = acc + i * ATTN_HEAD_DIM;
    for (int d = 0; d < ATTN_HEAD_DIM; d += kLanes) {
      ::aie::accum<accfloat, kLanes> o = ::aie::mul(::aie::load_v<kLanes>(acc_i + d), alpha);
      for (int j = 0; j < ATTN_LK; ++j)
        o = ::aie::mac(o, ::aie::load_v<kLanes>(v + j * ATTN_HEAD_DIM + d), ::aie::broadcast<bfloat16, kLanes>(p[j]));
      ::aie::store_v(acc_i + d, o.template to_vector<float>());
    }
  }
}

extern "C" void ATTN_FINISH_SYMBOL(float *LLAMA_NPU_RESTRICT l, float *LLAMA_NPU_RESTRICT acc,
                                   bfloat16 *LLAMA_NPU_RESTRICT out) {
  ::aie::set_rounding(::aie::rounding_mode::conv_even);
  for (int i = 0; i < ATTN_LQ; ++i) {
    const float inv = l[i] > 0.0f ? 1.0f / l[i] : 0.0f;
    for (int d = 0; d < ATTN_HEAD_DIM; d += kLanes) {
      ::aie::accum<accfloat, kLanes> o = ::aie::mul(::aie::load_v<kLanes>(acc + i * ATTN_HEAD_DIM + d), inv);
      ::aie::store_v(out + i * ATTN_HEAD_DIM + d, o.template to_vector<bfloat16>());
    }
  }
}

#else  // host scalar path: plain f32, exact exp, same update order as the description above

extern "C" void ATTN_INIT_SYMBOL(float *LLAMA_NPU_RESTRICT m, float *LLAMA_NPU_RESTRICT l,
                                 float *LLAMA_NPU_RESTRICT acc) {
  for (int i = 0; i < ATTN_LQ; ++i) {
    m[i] = kLowest;
    l[i] = 0.0f;
  }
  for (int i = 0; i < ATTN_LQ * ATTN_HEAD_DIM; ++i) acc[i] = 0.0f;
}

extern "C" void ATTN_STEP_SYMBOL(bfloat16 *LLAMA_NPU_RESTRICT q, bfloat16 *LLAMA_NPU_RESTRICT k,
                                 bfloat16 *LLAMA_NPU_RESTRICT v, float *LLAMA_NPU_RESTRICT m,
                                 float *LLAMA_NPU_RESTRICT l, float *LLAMA_NPU_RESTRICT acc, int32_t q_pos0,
                                 int32_t k_pos0, int32_t causal) {
  float s[ATTN_LK];
  for (int i = 0; i < ATTN_LQ; ++i) {
    const int32_t q_pos = q_pos0 + i;
    const bfloat16 *qi = q + static_cast<long>(i) * ATTN_HEAD_DIM;
    float row_max = kLowest;
    bool any = false;
    for (int j = 0; j < ATTN_LK; ++j) {
      if (attn_masked(causal, q_pos, k_pos0 + j)) continue;
      const bfloat16 *kj = k + static_cast<long>(j) * ATTN_HEAD_DIM;
      float dot = 0.0f;
      for (int d = 0; d < ATTN_HEAD_DIM; ++d) dot += bf16_to_f32(qi[d]) * bf16_to_f32(kj[d]);
      s[j] = dot * kScale;
      if (!any || s[j] > row_max) row_max = s[j];
      any = true;
    }
    if (!any) continue;
    const float m_new = m[i] > row_max ? m[i] : row_max;
    const float alpha = std::exp(m[i] - m_new);
    float *acc_i = acc + static_cast<long>(i) * ATTN_HEAD_DIM;
    float sum = 0.0f;
    for (int d = 0; d < ATTN_HEAD_DIM; ++d) acc_i[d] *= alpha;
    for (int j = 0; j < ATTN_LK; ++j) {
      if (attn_masked(causal, q_pos, k_pos0 + j)) continue;
      const float pj = std::exp(s[j] - m_new);
      sum += pj;
      const bfloat16 *vj = v + static_cast<long>(j) * ATTN_HEAD_DIM;
      for (int d = 0; d < ATTN_HEAD_DIM; ++d) acc_i[d] += pj * bf16_to_f32(vj[d]);
    }
    l[i] = alpha * l[i] + sum;
    m[i] = m_new;
  }
}

extern "C" void ATTN_FINISH_SYMBOL(float *LLAMA_NPU_RESTRICT l, float *LLAMA_NPU_RESTRICT acc,
                                   bfloat16 *LLAMA_NPU_RESTRICT out) {
  for (int i = 0; i < ATTN_LQ; ++i)
    for (int d = 0; d < ATTN_HEAD_DIM; ++d) {
      const long idx = static_cast<long>(i) * ATTN_HEAD_DIM + d;
      out[idx] = f32_to_bf16(l[i] > 0.0f ? acc[idx] / l[i] : 0.0f);
    }
}

#endif
