// Tile primitives of the `attention` kernel (kernel_builder/attention/builder.py): causal GQA attention with an
// online softmax whose state lives in f32 in L1.
//
// State of one core tile (f32, ATTN_LQ query rows): acc[ATTN_LQ][ATTN_HEAD_DIM] (unnormalised output), then
// m[ATTN_LQ] (running max of the scaled scores), then l[ATTN_LQ] (running sum of exp(score - m)).
// One update with a K tile and a V tile ([ATTN_LK][ATTN_HEAD_DIM] bf16, keys at k_pos0 .. k_pos0+ATTN_LK-1) for
// query row i at position q_pos0 + i * q_pos_step: keys after the query are masked; a row whose keys are all
// masked is left unchanged (so a schedule may stream tiles past the causal bound); otherwise, over the visible
// keys j, s_j = (q_i . k_j) * ATTN_SCALE, m' = max(m, max_j s_j), alpha = exp(m - m'),
// acc = alpha * acc + sum_j exp(s_j - m') v_j, l = alpha * l + sum_j exp(s_j - m'), m = m'.
//
// ATTN_MODE 1 (prefill; a core's input stream is a sequence of "items" of 2*ATTN_LK rows, each 8x8-blocked by the
// data movement: [2*ATTN_LK/8][ATTN_HEAD_DIM/8][8][8], every block row-major):
//   init(state, q): empty state, q = 0 (once per launch iteration)
//   item(item, q, state, t, n_q, slot, q_pos0): items t < n_q carry the "Q stream": the 8-row blocks of the Q
//       tiles of every core sharing the stream; item t holds stream blocks [t, t + 1) * 2*ATTN_LK/8. This core's
//       tile (ATTN_LQ/8 row blocks, kept 8x8-blocked in q) is stream blocks slot + i * ATTN_QCYCLE.
//       Item t >= n_q is the K/V tile (t - n_q): K = row blocks [0, ATTN_LK/8), V = the next ATTN_LK/8, keys at
//       (t - n_q)*ATTN_LK; one update of the tile's rows: row r of block i is at q_pos0 + i*8*ATTN_QCYCLE + r
//       (the herd's ATTN_QCYCLE cores interleave their 8-row blocks: causal work balanced among them).
//   finish(state, out): out = acc / l in bf16, row-major [ATTN_LQ][ATTN_HEAD_DIM] (rows with l == 0 -> 0); out
//       may be the q buffer; the state is emptied again for the next query block.
// ATTN_MODE 2 (decode; items of 2*ATTN_LK + ATTN_LQ rows: K, V, then the query rows of one GQA group):
//   init(state)
//   step(item, state, pos, k_pos0): one update of all ATTN_LQ rows at position pos.
//   merge(parts, out) (also ATTN_MODE 3): parts = ATTN_NPARTS states of the same rows over disjoint key ranges; with
//       M = max_s m_s, w_s = exp(m_s - M): out = (sum_s w_s acc_s) / (sum_s w_s l_s) in bf16 (0 when the sum is 0).
// ATTN_MODE 3 (decode over the KV8 cache, kernel_builder/attention_kv8; init and merge as ATTN_MODE 2): items of
//   ATTN_LK K code rows, ATTN_LK V code rows (int8 [ATTN_LK][ATTN_HEAD_DIM] each), then per key its K and V
//   scale (f32 pairs, powers of two); the query rows arrive once per launch iteration (q bf16 [ATTN_LQ][hd]):
//   step(item, q, state, pos, k_pos0): the visible keys' rows dequantized to bf16 (exact: code * 2^-shift) into
//   a scratch tile, then the ATTN_MODE 2 update of all ATTN_LQ rows at position pos.
// ATTN_SCALE is 1/sqrt(d) rounded to f32 (kernel_builder.reference.attention_scale; d = head_dim, or the model's
// query pre-attention scalar), a hex-float literal.
// ATTN_WINDOW (optional, 0 = full causal): a sliding window of that many keys: the query at q_pos sees the keys
// at q_pos - ATTN_WINDOW < k <= q_pos (transformers' sliding_window_overlay); in a tile, a range [first, vis).
#include "kernel_common.h"

#if !defined(ATTN_MODE) || !defined(ATTN_HEAD_DIM) || !defined(ATTN_LQ) || !defined(ATTN_LK) || \
    !defined(ATTN_SCALE) || !defined(ATTN_INIT_SYMBOL) || !defined(ATTN_UPDATE_SYMBOL) || !defined(ATTN_OUT_SYMBOL)
#error "compile with the -DATTN_* defines from kernel_builder/externals.py"
#endif
LLAMA_NPU_REQUIRE(ATTN_HEAD_DIM);
LLAMA_NPU_REQUIRE(ATTN_LQ);
LLAMA_NPU_REQUIRE(ATTN_LK);
#if ATTN_MODE == 1
LLAMA_NPU_REQUIRE(ATTN_QCYCLE);
static_assert(ATTN_LQ % 8 == 0 && ATTN_LK % 8 == 0, "prefill tiles are whole 8-row blocks");
#elif ATTN_MODE == 2 || ATTN_MODE == 3
LLAMA_NPU_REQUIRE(ATTN_NPARTS);
#else
#error "ATTN_MODE must be 1 (prefill), 2 (decode) or 3 (decode over the int8 KV8 cache)"
#endif

static constexpr int kHd = ATTN_HEAD_DIM;
static constexpr int kLq = ATTN_LQ;
static constexpr int kLk = ATTN_LK;
static constexpr float kScale = ATTN_SCALE;
static constexpr float kLowest = -0x1.fffffep127f;  // "no key seen yet"; exp(kLowest - m) == 0
#ifndef ATTN_WINDOW
#define ATTN_WINDOW 0
#endif
static constexpr int32_t kWindow = ATTN_WINDOW;
static_assert(kWindow >= 0, "ATTN_WINDOW must be >= 0 (0: full causal)");

static inline float *state_m(float *state) { return state + kLq * kHd; }
static inline float *state_l(float *state) { return state + kLq * kHd + kLq; }

// Keys of a tile at k_pos0 visible to a query at q_pos: a prefix of the tile (causal).
static inline int visible_keys(int32_t q_pos, int32_t k_pos0) {
  const int32_t n = q_pos - k_pos0 + 1;
  return n <= 0 ? 0 : (n >= kLk ? kLk : static_cast<int>(n));
}

// The first key of a tile at k_pos0 inside the sliding window of a query at q_pos (0 without a window); the row
// sees keys [first_key, visible_keys).
static inline int first_key(int32_t q_pos, int32_t k_pos0) {
  if (kWindow == 0) return 0;
  const int32_t f = q_pos - kWindow + 1 - k_pos0;
  return f <= 0 ? 0 : (f >= kLk ? kLk : static_cast<int>(f));
}

#if defined(__AIENGINE__)

// ---------------------------------------------------------------------------------------- AIE2P vector path
// Prefill: Q.K^T and P.V on the block-float matrix unit (below, at ATTN_MODE 1); the softmax runs on 16-lane
// f32/bf16 vectors (aie::exp2 returns bf16, so probabilities carry bf16 precision) in log2 units: m, in the state,
// is kept in those units by this path (prefill: Q arrives scaled by scale * log2(e); decode: the scores are
// scaled by that one f32 constant).
// Decode (a few query rows): 32-lane aie::mac dot products reduced 8 keys at a time (the reduction tree), and
// 32-lane p.V macs.
// Reciprocals use aie::inv on bf16 plus one f32 Newton step (no soft-float division on the core); the per-row
// softmax statistics (max, sum, alpha) are computed in 16-lane vectors, one lane per row (no scalar float
// arithmetic). Score/probability scratch, the statistics and the reduction tree's vectors live in static arrays
// (core data memory: decode < 2.5 KiB, in the planner's L1 reserve; prefill in its plan's "scratch"), not on the
// stack, so the call chain stays within aircc's default 1 KiB.
static constexpr int kLanes = 16;
static constexpr int kDotLanes = 32;
static constexpr float kLog2e = 1.4426950408889634f;
static constexpr float kScaleLog2e = kScale * kLog2e;  // scores -> log2 units in one multiply
static constexpr float kMaskedArg = -80.0f;  // exp2 argument of a masked key: ~1e-24, keeps exp2 normal
static_assert(kHd % kDotLanes == 0, "ATTN_HEAD_DIM must be a multiple of 32 on AIE2P");
static_assert(kLk % kLanes == 0, "ATTN_LK must be a multiple of 16 on AIE2P");

// 1/x for 16 lanes of positive x: bf16 reciprocal, refined once in f32 (r = r0 * (2 - x * r0)).
static inline ::aie::vector<float, kLanes> reciprocal16(::aie::vector<float, kLanes> x) {
  ::aie::accum<accfloat, kLanes> xa;
  xa.from_vector(x);
  const ::aie::vector<bfloat16, kLanes> r0b = ::aie::inv(xa.template to_vector<bfloat16>());
  ::aie::accum<accfloat, kLanes> r0a;
  r0a.from_vector(r0b);
  const ::aie::vector<float, kLanes> r0 = r0a.template to_vector<float>();
  ::aie::accum<accfloat, kLanes> two;
  two.from_vector(::aie::broadcast<float, kLanes>(2.0f));
  const ::aie::accum<accfloat, kLanes> e = ::aie::msc(two, x, r0);
  return ::aie::mul(e.template to_vector<float>(), r0).template to_vector<float>();
}

// 2^a for 16 lanes as bf16 (a in log2 units).
static inline ::aie::vector<bfloat16, kLanes> exp16(::aie::vector<float, kLanes> a) { return ::aie::exp2<bfloat16>(a); }

// x > 0 for a float read as its bits (+0 and negatives are not): no scalar float compare (emulated)
static inline bool positive(float x) { return __builtin_bit_cast(int32_t, x) > 0; }

// f32 vector helpers through the accumulator (AIE2P adds/subtracts f32 in accfloat)
static inline ::aie::vector<float, kLanes> vsub(::aie::vector<float, kLanes> a, ::aie::vector<float, kLanes> b) {
  ::aie::accum<accfloat, kLanes> x, y;
  x.from_vector(a);
  y.from_vector(b);
  return ::aie::sub(x, y).template to_vector<float>();
}
static inline ::aie::vector<float, kLanes> vadd(::aie::vector<float, kLanes> a, ::aie::vector<float, kLanes> b) {
  ::aie::accum<accfloat, kLanes> x, y;
  x.from_vector(a);
  y.from_vector(b);
  return ::aie::add(x, y).template to_vector<float>();
}
static inline ::aie::vector<float, kLanes> bf16_to_f32_16(::aie::vector<bfloat16, kLanes> v) {
  ::aie::accum<accfloat, kLanes> a;
  a.from_vector(v);
  return a.template to_vector<float>();
}

#include "attention_tree.h"  // the 8-row reduction tree (prefill row statistics, decode dot products)

static inline void reset_state(float *LLAMA_NPU_RESTRICT state) {
  for (int i = 0; i < kLq * kHd; i += kLanes) ::aie::store_v(state + i, ::aie::zeros<float, kLanes>());
  float *m = state_m(state), *l = state_l(state);
  for (int i = 0; i < kLq; ++i) {
    m[i] = kLowest;
    l[i] = 0.0f;
  }
}

// Softmax of n <= 16 rows of raw scores s[n][kLk] (f32, unscaled; scaled here by scale * log2e into log2 units); row
// r has visible keys [first[r], vis[r]), at least one. Updates m[0, n) and l[0, n), writes p[n][kLk] (bf16, masked keys 0) and
// alpha[0, n) = 2^(m_old - m_new). The per-row statistics live in 16-lane vectors (one lane per row): no scalar
// float arithmetic (the scalar unit would emulate it); scalars only move between vectors and memory.
static void softmax_rows(float *LLAMA_NPU_RESTRICT s, bfloat16 *LLAMA_NPU_RESTRICT p, int n, const int *vis,
                         const int *first, float *LLAMA_NPU_RESTRICT m, float *LLAMA_NPU_RESTRICT l, float *LLAMA_NPU_RESTRICT alpha) {
  alignas(::aie::vector_decl_align) static float rmax[kLanes], rsum[kLanes], mo[kLanes], lo[kLanes];
  alignas(::aie::vector_decl_align) static float mn[kLanes], mk[kLanes], al[kLanes], ln[kLanes];
  for (int r = 0; r < kLanes; ++r) {
    rmax[r] = kLowest;
    rsum[r] = 0.0f;
    mo[r] = r < n ? m[r] : kLowest;
    lo[r] = r < n ? l[r] : 0.0f;
  }
  for (int r = 0; r < n; ++r) {
    float *sr = s + r * kLk;
    for (int j = 0; j < kLk; j += kLanes)
      ::aie::store_v(sr + j, ::aie::mul(::aie::load_v<kLanes>(sr + j), kScaleLog2e).template to_vector<float>());
    for (int j = vis[r]; j < kLk; ++j) sr[j] = kLowest;  // masked keys never win the max
    for (int j = 0; j < first[r]; ++j) sr[j] = kLowest;   // ... nor the keys before the sliding window
    ::aie::vector<float, kLanes> vmax = ::aie::load_v<kLanes>(sr);
    for (int j = kLanes; j < kLk; j += kLanes) vmax = ::aie::max(vmax, ::aie::load_v<kLanes>(sr + j));
    rmax[r] = ::aie::reduce_max(vmax);
  }
  const ::aie::vector<float, kLanes> vmo = ::aie::load_v<kLanes>(mo);
  const ::aie::vector<float, kLanes> vmn = ::aie::max(vmo, ::aie::load_v<kLanes>(rmax));
  ::aie::store_v(mn, vmn);
  // exp argument of a masked key: m_new + kMaskedArg - m_new = kMaskedArg (exp ~ 0; zeroed below anyway)
  ::aie::store_v(mk, vadd(vmn, ::aie::broadcast<float, kLanes>(kMaskedArg)));
  const ::aie::vector<bfloat16, kLanes> ones = ::aie::broadcast<bfloat16, kLanes>(static_cast<bfloat16>(1.0f));
  for (int r = 0; r < n; ++r) {
    float *sr = s + r * kLk;
    bfloat16 *pr = p + r * kLk;
    for (int j = vis[r]; j < kLk; ++j) sr[j] = mk[r];
    for (int j = 0; j < first[r]; ++j) sr[j] = mk[r];
    const ::aie::vector<float, kLanes> mr = ::aie::broadcast<float, kLanes>(mn[r]);
    ::aie::accum<accfloat, kLanes> sum = ::aie::zeros<accfloat, kLanes>();
    for (int j = 0; j < kLk; j += kLanes) {
      ::aie::vector<bfloat16, kLanes> pj = exp16(vsub(::aie::load_v<kLanes>(sr + j), mr));
      ::aie::store_v(pr + j, pj);
      if (j + kLanes > vis[r]) {  // the chunk holding the causal edge: zero the masked probabilities
        for (int c = vis[r] > j ? vis[r] - j : 0; c < kLanes; ++c) pr[j + c] = static_cast<bfloat16>(0.0f);
        pj = ::aie::load_v<kLanes>(pr + j);
      }
      if (j < first[r]) {  // a chunk before the sliding window's first key: zero those probabilities
        for (int c = 0; c < kLanes && j + c < first[r]; ++c) pr[j + c] = static_cast<bfloat16>(0.0f);
        pj = ::aie::load_v<kLanes>(pr + j);
      }
      sum = ::aie::mac(sum, pj, ones);
    }
    rsum[r] = ::aie::reduce_add(sum.template to_vector<float>());
  }
  // alpha = 2^max(m_old - m_new, kMaskedArg) (log2 units); l = alpha * l + sum
  const ::aie::vector<float, kLanes> va =
      bf16_to_f32_16(exp16(::aie::max(vsub(vmo, vmn), ::aie::broadcast<float, kLanes>(kMaskedArg))));
  ::aie::store_v(al, va);
  ::aie::accum<accfloat, kLanes> lacc;
  lacc.from_vector(::aie::load_v<kLanes>(rsum));
  ::aie::store_v(ln, ::aie::mac(lacc, va, ::aie::load_v<kLanes>(lo)).template to_vector<float>());
  for (int r = 0; r < n; ++r) {
    m[r] = mn[r];
    l[r] = ln[r];
    alpha[r] = al[r];
  }
}

#if ATTN_MODE == 1
#include "attention_prefill.h"  // the block-float prefill path

#else  // ATTN_MODE == 2 || ATTN_MODE == 3

extern "C" void ATTN_INIT_SYMBOL(float *LLAMA_NPU_RESTRICT state) { reset_state(state); }

// One p.V pass over the keys [first, vis) for the 32-lane chunks c and c + 1 of one row (c only, when it is the last):
// acc = alpha * acc + sum_j p_j v_j, one broadcast probability per key for both chunks; two named accumulators, so
// no array of accumulators can spill onto the call chain's stack whatever the head dimension
static inline void pv_pass(float *LLAMA_NPU_RESTRICT acc, const bfloat16 *LLAMA_NPU_RESTRICT v,
                           const bfloat16 *LLAMA_NPU_RESTRICT pr, float alpha, int first, int vis, int c) {
  constexpr int kC = kHd / kDotLanes;
  const bool two = c + 1 < kC;
  float *a0 = acc + c * kDotLanes, *a1 = a0 + kDotLanes;
  ::aie::accum<accfloat, kDotLanes> o0 = ::aie::mul(::aie::load_v<kDotLanes>(a0), alpha), o1;
  if (two) o1 = ::aie::mul(::aie::load_v<kDotLanes>(a1), alpha);
  for (int j = first; j < vis; ++j) {
    const ::aie::vector<bfloat16, kDotLanes> pj = ::aie::broadcast<bfloat16, kDotLanes>(pr[j]);
    o0 = ::aie::mac(o0, ::aie::load_v<kDotLanes>(v + j * kHd + c * kDotLanes), pj);
    if (two) o1 = ::aie::mac(o1, ::aie::load_v<kDotLanes>(v + j * kHd + (c + 1) * kDotLanes), pj);
  }
  ::aie::store_v(a0, o0.template to_vector<float>());
  if (two) ::aie::store_v(a1, o1.template to_vector<float>());
}

// One decode update of the kLq rows at pos with keys [first, vis) of a bf16 K/V tile (rounding mode set by the
// caller). Scores 8 keys at a time from the 8-aligned key below first (keys outside [first, vis) are computed from
// whatever their rows hold and masked by softmax_rows); p.V in passes of two 32-lane chunks (pv_pass), each output
// lane the same sequence of f32 MACs as one lane at a time.
static void decode_update(const bfloat16 *LLAMA_NPU_RESTRICT k, const bfloat16 *LLAMA_NPU_RESTRICT v,
                          const bfloat16 *LLAMA_NPU_RESTRICT q, float *LLAMA_NPU_RESTRICT state, int vis, int first) {
  alignas(::aie::vector_decl_align) static float s[4 * kLk];
  alignas(::aie::vector_decl_align) static bfloat16 p[4 * kLk];
  constexpr int kC = kHd / kDotLanes;                 // 32-lane chunks of a row
  float *m = state_m(state), *l = state_l(state);
  const int visv[4] = {vis, vis, vis, vis};          // every row is at the position
  const int firstv[4] = {first, first, first, first};
  const int j8 = first / 8 * 8;
  for (int i0 = 0; i0 < kLq; i0 += 4) {
    const int n = kLq - i0 < 4 ? kLq - i0 : 4;
    for (int r = 0; r < n; ++r)
      for (int j = j8; j < vis; j += 8) ::aie::store_v(s + r * kLk + j, dots8(q + (i0 + r) * kHd, k + j * kHd));
    alignas(::aie::vector_decl_align) float alpha[4];
    softmax_rows(s, p, n, visv, firstv, m + i0, l + i0, alpha);
    for (int r = 0; r < n; ++r)
      for (int c = 0; c < kC; c += 2) pv_pass(state + (i0 + r) * kHd, v, p + r * kLk, alpha[r], first, vis, c);
  }
}

#if ATTN_MODE == 2
extern "C" void ATTN_UPDATE_SYMBOL(bfloat16 *LLAMA_NPU_RESTRICT item, float *LLAMA_NPU_RESTRICT state, int32_t pos,
                                   int32_t k_pos0) {
  ::aie::set_rounding(::aie::rounding_mode::conv_even);
  const int vis = visible_keys(pos, k_pos0), first = first_key(pos, k_pos0);
  if (first >= vis) return;
  decode_update(item, item + kLk * kHd, item + 2 * kLk * kHd, state, vis, first);
}
#else
#include "attention_kv8.h"  // ATTN_MODE 3: the int8 cache's step
#endif

extern "C" void ATTN_OUT_SYMBOL(float *LLAMA_NPU_RESTRICT parts, bfloat16 *LLAMA_NPU_RESTRICT out) {
  ::aie::set_rounding(::aie::rounding_mode::conv_even);
  constexpr int kState = kLq * (kHd + 2);
  static_assert(kLq <= kLanes, "the merge keeps one lane per query row");
  // per part s: m_s and l_s of the kLq rows in lanes; M = max_s m_s, w_s = exp(m_s - M), L = sum_s w_s l_s
  alignas(::aie::vector_decl_align) static float ms[ATTN_NPARTS][kLanes], ls[ATTN_NPARTS][kLanes];
  for (int p = 0; p < ATTN_NPARTS; ++p)
    for (int r = 0; r < kLanes; ++r) {
      ms[p][r] = r < kLq ? state_m(parts + p * kState)[r] : kLowest;
      ls[p][r] = r < kLq ? state_l(parts + p * kState)[r] : 0.0f;
    }
  ::aie::vector<float, kLanes> vm = ::aie::load_v<kLanes>(ms[0]);
  for (int p = 1; p < ATTN_NPARTS; ++p) vm = ::aie::max(vm, ::aie::load_v<kLanes>(ms[p]));
  alignas(::aie::vector_decl_align) static float w[ATTN_NPARTS][kLanes];
  ::aie::accum<accfloat, kLanes> total = ::aie::zeros<accfloat, kLanes>();
  for (int p = 0; p < ATTN_NPARTS; ++p) {
    const ::aie::vector<float, kLanes> d =
        ::aie::max(vsub(::aie::load_v<kLanes>(ms[p]), vm), ::aie::broadcast<float, kLanes>(kMaskedArg));
    const ::aie::vector<float, kLanes> wp = bf16_to_f32_16(exp16(d));
    ::aie::store_v(w[p], wp);
    total = ::aie::mac(total, wp, ::aie::load_v<kLanes>(ls[p]));
  }
  alignas(::aie::vector_decl_align) static float tot[kLanes], inv[kLanes];
  ::aie::store_v(tot, total.template to_vector<float>());
  for (int r = 0; r < kLanes; ++r) inv[r] = r < kLq && positive(tot[r]) ? tot[r] : 1.0f;
  ::aie::store_v(inv, reciprocal16(::aie::load_v<kLanes>(inv)));
  for (int r = 0; r < kLq; ++r) {
    const float scale = positive(tot[r]) ? inv[r] : 0.0f;
    for (int d = 0; d < kHd; d += kLanes) {
      ::aie::accum<accfloat, kLanes> o = ::aie::zeros<accfloat, kLanes>();
      // part p starts p * kState floats in: 8-byte aligned only (kState = kLq * (kHd + 2)), so the 512-bit
      // load must be an unaligned one (a plain load_v would read the truncated, wrong address on the chip)
      for (int p = 0; p < ATTN_NPARTS; ++p)
        o = ::aie::mac(o, ::aie::load_unaligned_v<kLanes>(parts + p * kState + r * kHd + d, 2),
                       ::aie::broadcast<float, kLanes>(w[p][r]));
      ::aie::store_v(out + r * kHd + d, ::aie::mul(o.template to_vector<float>(), scale).template to_vector<bfloat16>());
    }
  }
}

#endif  // ATTN_MODE

#else  // ------------------------------------------------------------ host scalar path: plain f32, exact exp

static void reset_state(float *state) {
  for (int i = 0; i < kLq * kHd; ++i) state[i] = 0.0f;
  for (int i = 0; i < kLq; ++i) {
    state_m(state)[i] = kLowest;
    state_l(state)[i] = 0.0f;
  }
}

// One online-softmax update of the rows at q_pos0 + i*q_pos_step with a K/V tile at k_pos0. The numpy model
// kernel_builder.external_models.attention_model follows this order of f32 operations.
[[maybe_unused]] static void update(const bfloat16 *k, const bfloat16 *v, const bfloat16 *q, float *state, int32_t q_pos0,
                   int32_t q_pos_step, int32_t k_pos0) {
  float s[kLk];
  float *m = state_m(state), *l = state_l(state);
  for (int i = 0; i < kLq; ++i) {
    const int vis = visible_keys(q_pos0 + i * q_pos_step, k_pos0);
    const int first = first_key(q_pos0 + i * q_pos_step, k_pos0);
    if (first >= vis) continue;
    const bfloat16 *qi = q + static_cast<long>(i) * kHd;
    float row_max = kLowest;
    for (int j = first; j < vis; ++j) {
      const bfloat16 *kj = k + static_cast<long>(j) * kHd;
      float dot = 0.0f;
      for (int d = 0; d < kHd; ++d) dot += bf16_to_f32(qi[d]) * bf16_to_f32(kj[d]);
      s[j] = dot * kScale;
      if (j == first || s[j] > row_max) row_max = s[j];
    }
    const float m_new = m[i] > row_max ? m[i] : row_max;
    const float alpha = std::exp(m[i] - m_new);
    float *acc_i = state + static_cast<long>(i) * kHd;
    for (int d = 0; d < kHd; ++d) acc_i[d] *= alpha;
    float sum = 0.0f;
    for (int j = first; j < vis; ++j) {
      const float pj = std::exp(s[j] - m_new);
      sum += pj;
      const bfloat16 *vj = v + static_cast<long>(j) * kHd;
      for (int d = 0; d < kHd; ++d) acc_i[d] += pj * bf16_to_f32(vj[d]);
    }
    l[i] = alpha * l[i] + sum;
    m[i] = m_new;
  }
}

#if ATTN_MODE == 1
#include "attention_prefill.h"  // the scalar prefill path

#else  // ATTN_MODE == 2 || ATTN_MODE == 3

extern "C" void ATTN_INIT_SYMBOL(float *LLAMA_NPU_RESTRICT state) { reset_state(state); }

#if ATTN_MODE == 2
extern "C" void ATTN_UPDATE_SYMBOL(bfloat16 *LLAMA_NPU_RESTRICT item, float *LLAMA_NPU_RESTRICT state, int32_t pos,
                                   int32_t k_pos0) {
  update(item, item + kLk * kHd, item + 2 * kLk * kHd, state, pos, 0, k_pos0);
}
#else
#include "attention_kv8.h"  // ATTN_MODE 3: the int8 cache's step
#endif

extern "C" void ATTN_OUT_SYMBOL(float *LLAMA_NPU_RESTRICT parts, bfloat16 *LLAMA_NPU_RESTRICT out) {
  constexpr long kState = static_cast<long>(kLq) * (kHd + 2);
  for (int i = 0; i < kLq; ++i) {
    float mx = kLowest;
    for (int s = 0; s < ATTN_NPARTS; ++s) {
      const float ms = state_m(parts + s * kState)[i];
      if (ms > mx) mx = ms;
    }
    float w[ATTN_NPARTS];
    float total = 0.0f;
    for (int s = 0; s < ATTN_NPARTS; ++s) {
      w[s] = std::exp(state_m(parts + s * kState)[i] - mx);
      total += w[s] * state_l(parts + s * kState)[i];
    }
    for (int d = 0; d < kHd; ++d) {
      float o = 0.0f;
      for (int s = 0; s < ATTN_NPARTS; ++s) o += w[s] * parts[s * kState + static_cast<long>(i) * kHd + d];
      out[static_cast<long>(i) * kHd + d] = f32_to_bf16(total > 0.0f ? o / total : 0.0f);
    }
  }
}

#endif  // ATTN_MODE

#endif  // __AIENGINE__
