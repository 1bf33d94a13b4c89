// The prefill path (ATTN_MODE 1) of external_kernels/attention.cc, included by it twice: once in its AIE2P
// vector region (__AIENGINE__: the block-float path below) and once in its host scalar region (the plain f32
// path after #else); only one of the two is compiled per build. It uses attention.cc's shared helpers and
// defines; its interface and layouts are described at the top of attention.cc.
#if defined(__AIENGINE__)

// Prefill on the block-float matrix unit: aie::mmul<8, 8, 8, bfp16ebs8, bfp16ebs8> (aie_api
// aie2p/mmul_bfp16_bfp16.hpp: one mac_8x8_8x8T_conf per call, B given as [N][K] row-major), as gemm.cc.
// Every L1 operand is 8x8-blocked ([rows/8][cols/8][8][8], each block row-major), built by the memory tile's
// L2 -> L1 DMA (kernel_builder/attention/builder.py), so no block is gathered from rows in the core:
//   Q tile  [lq/8][hd/8] blocks, pre-scaled by scale * log2(e) when captured (exact bf16 products of a bf16 pair
//           of the constant, one rounding to bf16): scores come out in log2 units, no multiply in the softmax;
//   K       [lk/8][hd/8] blocks (rows = keys, columns = dims): exactly mac_8x8_8x8T's B for S = Q.K^T as stored;
//   V       [lk/8][hd/8] blocks; P.V needs B = V^T blocks ([dims][keys]). DMAs move 32-bit words, so a bf16
//           transpose cannot be done by the data movement (docs/hardware-model.md, transfers); the core
//           transposes each V block once per item, shared by all lq/8 row blocks.
//   acc     [lq/8][hd/8] f32 blocks (the state's first lq*hd floats; m and l follow as in the other paths).
// Every operand block is converted to block float ONCE and re-read as block float (aie_api's block_vector buffer
// streams, as gemm.cc does), IN PLACE: block b's 72 bytes go to byte 72*b of its buffer, below the 128*(b+1) where
// the next unread bf16 block starts. Q when captured (each row block's hd/8 blocks packed at the front of that row
// block's bf16 region), K and the transposed V once per item, the probabilities once per row block; the values are
// the ones the per-use conversions gave (same blocks, same rounding).
// A row block is 8 query rows; block i of this core sits at position q_pos0 + i * 8 * ATTN_QCYCLE (the herd's
// cores interleave their 8-row blocks, which balances the causal work). Two output blocks share each block-float
// A block read (S: two key blocks; P.V: two dim blocks). Probabilities are bf16 (exp2), then block float for P.V.
#if AIE_API_EMULATE_BFLOAT16_MMUL_WITH_BFP16 != 1
#error "attention.cc's prefill vector path is block-float: compile with -DAIE_API_EMULATE_BFLOAT16_MMUL_WITH_BFP16=1"
#endif
static constexpr int kBlk = 64;                   // elements of an 8x8 block
static constexpr int kQB = kLq / 8, kKB = kLk / 8, kDB = kHd / 8;
static constexpr int kCycle = ATTN_QCYCLE;
static constexpr int32_t kQStep = 8 * kCycle;     // positions between consecutive row blocks of a tile
static constexpr int kItemBlocks = 2 * kLk / 8;   // row blocks of an item
static_assert(kLq % 8 == 0 && kLk % 16 == 0 && kHd % 16 == 0, "prefill tiles must be whole pairs of 8x8 blocks");
using Mmul8 = ::aie::mmul<8, 8, 8, bfp16ebs8, bfp16ebs8, accauto>;
using Bfp = ::aie::block_vector<bfp16ebs8, kBlk>;

using BfpOut = ::aie::block_vector_output_buffer_stream<bfp16ebs8, kBlk>;
using BfpIn = ::aie::block_vector_input_buffer_stream<bfp16ebs8, kBlk>;

static inline Bfp to_bfp(const ::aie::vector<bfloat16, kBlk> &x) {
  ::aie::accum<accfloat, kBlk> wide;
  wide.from_vector(x);
  return wide.template to_vector<bfp16ebs8>();
}
static inline bfp16ebs8 *as_bfp(bfloat16 *p) { return reinterpret_cast<bfp16ebs8 *>(p); }
static inline const bfp16ebs8 *as_bfp(const bfloat16 *p) { return reinterpret_cast<const bfp16ebs8 *>(p); }

// the n bf16 blocks at p as block float, in place, in order
static void blocks_to_bfp(bfloat16 *LLAMA_NPU_RESTRICT p, int n) {
  BfpOut out(as_bfp(p));
  for (int b = 0; b < n; ++b) out << to_bfp(::aie::load_v<kBlk>(p + b * kBlk));
}

extern "C" void ATTN_INIT_SYMBOL(float *LLAMA_NPU_RESTRICT state, bfloat16 *LLAMA_NPU_RESTRICT q) {
  reset_state(state);
  for (int i = 0; i < kLq * kHd; i += kDotLanes) ::aie::store_v(q + i, ::aie::zeros<bfloat16, kDotLanes>());
}

// S (8 rows x kLk keys, f32, row-major, log2 units) = Q block row . K^T; qb: the row block's kDB block-float Q
// blocks, k: the item's [kKB][kDB] block-float K blocks
static void scores8(const bfloat16 *LLAMA_NPU_RESTRICT qb, const bfloat16 *LLAMA_NPU_RESTRICT k,
                    float *LLAMA_NPU_RESTRICT s) {
  for (int jb = 0; jb < kKB; jb += 2) {
    BfpIn as(as_bfp(qb)), b0s(as_bfp(k)), b1s(as_bfp(k));
    b0s.seek(jb * kDB);
    b1s.seek((jb + 1) * kDB);
    Mmul8 c0, c1;
    for (int d = 0; d < kDB; ++d) {
      const Bfp a = as.pop(), b0 = b0s.pop(), b1 = b1s.pop();
      if (d == 0) {
        c0.mul(a, b0);
        c1.mul(a, b1);
      } else {
        c0.mac(a, b0);
        c1.mac(a, b1);
      }
    }
    const ::aie::vector<float, kBlk> x0 = c0.template to_vector<float>(), x1 = c1.template to_vector<float>();
    for (int r = 0; r < 8; ++r)
      ::aie::store_v(s + r * kLk + jb * 8, ::aie::concat(x0.template extract<8>(r), x1.template extract<8>(r)));
  }
}

// row r's max over its chunks, lane by lane (kLowest for a row without keys); masked scores set to kLowest
static inline ::aie::vector<float, kLanes> row_max16(float *LLAMA_NPU_RESTRICT s, int r, const int *vis, const int *first) {
  if (first[r] >= vis[r]) return ::aie::broadcast<float, kLanes>(kLowest);
  float *sr = s + r * kLk;
  for (int j = vis[r]; j < kLk; ++j) sr[j] = kLowest;  // masked keys never win the max
  for (int j = 0; j < first[r]; ++j) sr[j] = kLowest;   // ... nor the keys before the sliding window
  ::aie::vector<float, kLanes> vmax = ::aie::load_v<kLanes>(sr);
  for (int j = kLanes; j < kLk; j += kLanes) vmax = ::aie::max(vmax, ::aie::load_v<kLanes>(sr + j));
  return vmax;
}

// row r's probabilities 2^(s - m_new) into p (bf16, row r of each 8x8 block; masked keys 0) and their sum, lane by
// lane (0 for a row without keys)
static inline ::aie::vector<float, kLanes> row_exp16(float *LLAMA_NPU_RESTRICT s, bfloat16 *LLAMA_NPU_RESTRICT p, int r,
                                                     const int *vis, const int *first, const float *mn, const float *mk,
                                                     const ::aie::vector<bfloat16, kLanes> &ones) {
  alignas(::aie::vector_decl_align) static bfloat16 edge[kLanes];
  bfloat16 *pr = p + r * 8;                            // row r of each 8x8 block
  if (first[r] >= vis[r]) {
    for (int jb = 0; jb < kKB; ++jb) ::aie::store_v(pr + jb * kBlk, ::aie::zeros<bfloat16, 8>());
    return ::aie::zeros<float, kLanes>();
  }
  float *sr = s + r * kLk;
  for (int j = vis[r]; j < kLk; ++j) sr[j] = mk[r];
  for (int j = 0; j < first[r]; ++j) sr[j] = mk[r];
  const ::aie::vector<float, kLanes> mr = ::aie::broadcast<float, kLanes>(mn[r]);
  ::aie::accum<accfloat, kLanes> sum = ::aie::zeros<accfloat, kLanes>();
  for (int j = 0; j < kLk; j += kLanes) {
    ::aie::vector<bfloat16, kLanes> pj = exp16(vsub(::aie::load_v<kLanes>(sr + j), mr));
    if (j + kLanes > vis[r] || j < first[r]) {  // a chunk holding the causal edge or the window's start
      ::aie::store_v(edge, pj);
      for (int c = 0; c < kLanes; ++c)
        if (j + c >= vis[r] || j + c < first[r]) edge[c] = static_cast<bfloat16>(0.0f);
      pj = ::aie::load_v<kLanes>(edge);
    }
    ::aie::store_v(pr + (j / 8) * kBlk, pj.template extract<8>(0));
    ::aie::store_v(pr + (j / 8 + 1) * kBlk, pj.template extract<8>(1));
    sum = ::aie::mac(sum, pj, ones);
  }
  return sum.template to_vector<float>();
}

// Online softmax of 8 rows of scores s[8][kLk] (log2 units); row r sees keys [first[r], vis[r]) (possibly none:
// then its probabilities are 0 and, below, alpha = 2^0 = 1, m and l unchanged). Writes p (bf16, 8x8-blocked
// [kKB][8][8], masked keys 0), updates m[0, 8) and l[0, 8), and a64 = alpha of row r in lanes [8r, 8r + 8).
// The rows' maxima and sums come out of the reduction tree, its level 1 taken as each pair of rows is done.
static void softmax8(float *LLAMA_NPU_RESTRICT s, bfloat16 *LLAMA_NPU_RESTRICT p, const int *vis, const int *first,
                     float *LLAMA_NPU_RESTRICT m, float *LLAMA_NPU_RESTRICT l, float *LLAMA_NPU_RESTRICT a64) {
  alignas(::aie::vector_decl_align) static float rmax[kLanes], rsum[kLanes], mo[kLanes], lo[kLanes];
  alignas(::aie::vector_decl_align) static float mn[kLanes], mk[kLanes], al[kLanes], ln[kLanes];
  for (int r = 0; r < kLanes; ++r) {
    rmax[r] = kLowest;
    rsum[r] = 0.0f;
    mo[r] = r < 8 ? m[r] : kLowest;
    lo[r] = r < 8 ? l[r] : 0.0f;
  }
  for (int q = 0; q < 4; ++q)
    ::aie::store_v(g_tree_w + q * kLanes, pair_halves(row_max16(s, kTreeA[q], vis, first),
                                                      row_max16(s, kTreeB[q], vis, first), MaxOp{}));
  ::aie::store_v(rmax, reduce8_tail(MaxOp{}));   // lanes [8, 16) stay kLowest
  const ::aie::vector<float, kLanes> vmo = ::aie::load_v<kLanes>(mo);
  const ::aie::vector<float, kLanes> vmn = ::aie::max(vmo, ::aie::load_v<kLanes>(rmax));
  ::aie::store_v(mn, vmn);
  ::aie::store_v(mk, vadd(vmn, ::aie::broadcast<float, kLanes>(kMaskedArg)));
  const ::aie::vector<bfloat16, kLanes> ones = ::aie::broadcast<bfloat16, kLanes>(static_cast<bfloat16>(1.0f));
  for (int q = 0; q < 4; ++q)
    ::aie::store_v(g_tree_w + q * kLanes, pair_halves(row_exp16(s, p, kTreeA[q], vis, first, mn, mk, ones),
                                                      row_exp16(s, p, kTreeB[q], vis, first, mn, mk, ones), AddOp{}));
  ::aie::store_v(rsum, reduce8_tail(AddOp{}));   // lanes [8, 16) stay 0
  // alpha = 2^max(m_old - m_new, kMaskedArg) (1 for a row without keys: m_new = m_old); l = alpha * l + sum
  const ::aie::vector<float, kLanes> va =
      bf16_to_f32_16(exp16(::aie::max(vsub(vmo, vmn), ::aie::broadcast<float, kLanes>(kMaskedArg))));
  ::aie::store_v(al, va);
  ::aie::accum<accfloat, kLanes> lacc;
  lacc.from_vector(::aie::load_v<kLanes>(rsum));
  ::aie::store_v(ln, ::aie::mac(lacc, va, ::aie::load_v<kLanes>(lo)).template to_vector<float>());
  for (int r = 0; r < 8; ++r) {
    m[r] = mn[r];
    l[r] = ln[r];
    ::aie::store_v(a64 + r * 8, ::aie::broadcast<float, 8>(al[r]));
  }
}

// acc (one row block: kDB f32 blocks) = alpha * acc + P . V; p: the kKB probability blocks (bf16, converted to
// block float here, in place), vt: the item's [kKB][kDB] block-float V^T blocks ([dims][keys] each)
static void pv8(bfloat16 *LLAMA_NPU_RESTRICT p, const bfloat16 *LLAMA_NPU_RESTRICT vt, float *LLAMA_NPU_RESTRICT acc,
                const float *LLAMA_NPU_RESTRICT a64) {
  blocks_to_bfp(p, kKB);
  const ::aie::vector<float, kBlk> alpha = ::aie::load_v<kBlk>(a64);
  for (int db = 0; db < kDB; db += 2) {
    float *c0 = acc + db * kBlk, *c1 = c0 + kBlk;
    Mmul8 m0(::aie::mul(::aie::load_v<kBlk>(c0), alpha)), m1(::aie::mul(::aie::load_v<kBlk>(c1), alpha));
    BfpIn ps(as_bfp(p));
    for (int jb = 0; jb < kKB; ++jb) {
      BfpIn vs(as_bfp(vt));
      vs.seek(jb * kDB + db);   // V^T blocks (jb, db) and (jb, db + 1): adjacent
      const Bfp a = ps.pop(), y0 = vs.pop(), y1 = vs.pop();
      m0.mac(a, y0);
      m1.mac(a, y1);
    }
    ::aie::store_v(c0, m0.template to_vector<float>());
    ::aie::store_v(c1, m1.template to_vector<float>());
  }
}

static void update_prefill(bfloat16 *LLAMA_NPU_RESTRICT k, bfloat16 *LLAMA_NPU_RESTRICT v,
                           const bfloat16 *LLAMA_NPU_RESTRICT q, float *LLAMA_NPU_RESTRICT state, int32_t q_pos0,
                           int32_t k_pos0) {
  ::aie::set_rounding(::aie::rounding_mode::conv_even);
  const int32_t q_last = q_pos0 + (kQB - 1) * kQStep + 7;
  if (k_pos0 > q_last) return;                                  // every key after every query of the tile
  if (kWindow && k_pos0 + kLk - 1 <= q_pos0 - kWindow) return;  // every key before every query's window
  alignas(::aie::vector_decl_align) static float s[8 * kLk];
  alignas(::aie::vector_decl_align) static bfloat16 p[8 * kLk];
  alignas(::aie::vector_decl_align) static float a64[kBlk];
  float *m = state_m(state), *l = state_l(state);
  // keys no row of the tile sees may hold anything (a KV window past the chunk): zero their V rows so that
  // p = 0 never meets a NaN/inf (a block-float block holding one is NaN as a whole); then K and the V^T blocks as
  // block float, in place
  for (int j = visible_keys(q_last, k_pos0); j < kLk; ++j)
    for (int d = 0; d < kDB; ++d) ::aie::store_v(v + ((j / 8) * kDB + d) * kBlk + (j % 8) * 8, ::aie::zeros<bfloat16, 8>());
  blocks_to_bfp(k, kKB * kDB);
  {
    BfpOut out(as_bfp(v));
    for (int b = 0; b < kKB * kDB; ++b) out << to_bfp(::aie::transpose(::aie::load_v<kBlk>(v + b * kBlk), 8, 8));
  }
  for (int i = 0; i < kQB; ++i) {
    const int32_t qp = q_pos0 + i * kQStep;
    if (k_pos0 > qp + 7) continue;                                  // no row of this block sees a key of the tile
    if (kWindow && k_pos0 + kLk - 1 <= qp - kWindow) continue;      // ... or the tile is before every window
    scores8(q + i * kDB * kBlk, k, s);
    int vis[8], first[8];
    for (int r = 0; r < 8; ++r) {
      vis[r] = visible_keys(qp + r, k_pos0);
      first[r] = first_key(qp + r, k_pos0);
    }
    softmax8(s, p, vis, first, m + i * 8, l + i * 8, a64);
    pv8(p, v, state + i * kDB * kBlk, a64);
  }
}

// A Q item: row blocks u of the stream's block t * kItemBlocks + u; this core's block i is stream block
// slot + i * kCycle. Captured scaled by scale * log2(e) = c_hi + c_lo (a bf16 pair): exact products, one rounding;
// stored as block float.
static void capture_q(const bfloat16 *LLAMA_NPU_RESTRICT item, bfloat16 *LLAMA_NPU_RESTRICT q, int32_t t, int32_t slot) {
  const bfloat16 c_hi = static_cast<bfloat16>(kScaleLog2e);
  const bfloat16 c_lo = static_cast<bfloat16>(kScaleLog2e - static_cast<float>(c_hi));
  for (int u = 0; u < kItemBlocks; ++u) {
    const int32_t d = t * kItemBlocks + u - slot;
    if (d < 0 || d >= kQB * kCycle || d % kCycle) continue;
    const bfloat16 *src = item + u * kDB * kBlk;
    BfpOut out(as_bfp(q + (d / kCycle) * kDB * kBlk));   // packed at the front of the row block's region
    for (int e = 0; e < kDB * kBlk; e += kBlk) {
      const ::aie::vector<bfloat16, kBlk> x = ::aie::load_v<kBlk>(src + e);
      out << to_bfp(::aie::mac(::aie::mul(x, c_hi), x, c_lo).template to_vector<bfloat16>());
    }
  }
}

extern "C" void ATTN_UPDATE_SYMBOL(bfloat16 *LLAMA_NPU_RESTRICT item, bfloat16 *LLAMA_NPU_RESTRICT q,
                                   float *LLAMA_NPU_RESTRICT state, int32_t t, int32_t n_q, int32_t slot,
                                   int32_t q_pos0) {
  ::aie::set_rounding(::aie::rounding_mode::conv_even);
  if (t < n_q) {
    capture_q(item, q, t, slot);
    return;
  }
  update_prefill(item, item + kLk * kHd, q, state, q_pos0, (t - n_q) * kLk);
}

extern "C" void ATTN_OUT_SYMBOL(float *LLAMA_NPU_RESTRICT state, bfloat16 *LLAMA_NPU_RESTRICT out) {
  ::aie::set_rounding(::aie::rounding_mode::conv_even);
  constexpr int kRows = (kLq + kLanes - 1) / kLanes * kLanes;
  const float *l = state_l(state);
  alignas(::aie::vector_decl_align) static float inv[kRows], lv[kLanes], w64[kBlk];
  for (int i0 = 0; i0 < kLq; i0 += kLanes) {
    for (int r = 0; r < kLanes; ++r) lv[r] = i0 + r < kLq && positive(l[i0 + r]) ? l[i0 + r] : 1.0f;
    ::aie::store_v(inv + i0, reciprocal16(::aie::load_v<kLanes>(lv)));
  }
  for (int i = 0; i < kQB; ++i) {   // out row-major [lq][hd]: rows with l == 0 -> 0
    for (int r = 0; r < 8; ++r)
      ::aie::store_v(w64 + r * 8, ::aie::broadcast<float, 8>(positive(l[i * 8 + r]) ? inv[i * 8 + r] : 0.0f));
    const ::aie::vector<float, kBlk> w = ::aie::load_v<kBlk>(w64);
    for (int db = 0; db < kDB; ++db) {
      const ::aie::vector<bfloat16, kBlk> o =
          ::aie::mul(::aie::load_v<kBlk>(state + (i * kDB + db) * kBlk), w).template to_vector<bfloat16>();
      for (int r = 0; r < 8; ++r) ::aie::store_v(out + (i * 8 + r) * kHd + db * 8, o.template extract<8>(r));
    }
  }
  reset_state(state);  // ready for the next query block
}

#else  // host scalar path

// The same blocked layouts as the vector path (Q tile and item 8x8-blocked; acc row-major here), plain f32.
static constexpr int kDB = kHd / 8;
static constexpr int kQB = kLq / 8;
static constexpr int kCycle = ATTN_QCYCLE;
static constexpr int kItemBlocks = 2 * kLk / 8;

// element (row, col) of an 8x8-blocked [rows/8][kHd/8][8][8] buffer
static inline float blocked(const bfloat16 *b, int row, int col) {
  return bf16_to_f32(b[(static_cast<long>(row / 8) * kDB + col / 8) * 64 + (row % 8) * 8 + col % 8]);
}

// One online-softmax update of the tile's rows (local row i at q_pos0 + (i / 8) * 8 * ATTN_QCYCLE + i % 8) with
// the K/V tile at k_pos0; kernel_builder.attention.external.attention_model follows this order of f32 operations.
static void update_prefill(const bfloat16 *k, const bfloat16 *v, const bfloat16 *q, float *state, int32_t q_pos0,
                           int32_t k_pos0) {
  float s[kLk];
  float *m = state_m(state), *l = state_l(state);
  for (int i = 0; i < kLq; ++i) {
    const int32_t q_pos = q_pos0 + (i / 8) * 8 * kCycle + i % 8;
    const int vis = visible_keys(q_pos, k_pos0), first = first_key(q_pos, k_pos0);
    if (first >= vis) continue;
    float row_max = kLowest;
    for (int j = first; j < vis; ++j) {
      float dot = 0.0f;
      for (int d = 0; d < kHd; ++d) dot += blocked(q, i, d) * blocked(k, j, d);
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
      for (int d = 0; d < kHd; ++d) acc_i[d] += pj * blocked(v, j, d);
    }
    l[i] = alpha * l[i] + sum;
    m[i] = m_new;
  }
}

extern "C" void ATTN_INIT_SYMBOL(float *LLAMA_NPU_RESTRICT state, bfloat16 *LLAMA_NPU_RESTRICT q) {
  reset_state(state);
  for (long i = 0; i < static_cast<long>(kLq) * kHd; ++i) q[i] = bfloat16{0};
}

extern "C" void ATTN_UPDATE_SYMBOL(bfloat16 *LLAMA_NPU_RESTRICT item, bfloat16 *LLAMA_NPU_RESTRICT q,
                                   float *LLAMA_NPU_RESTRICT state, int32_t t, int32_t n_q, int32_t slot,
                                   int32_t q_pos0) {
  if (t < n_q) {  // stream block slot + i * ATTN_QCYCLE is this core's row block i (unscaled here)
    for (int u = 0; u < kItemBlocks; ++u) {
      const long d = static_cast<long>(t) * kItemBlocks + u - slot;
      if (d < 0 || d >= static_cast<long>(kQB) * kCycle || d % kCycle) continue;
      for (long e = 0; e < kDB * 64; ++e) q[(d / kCycle) * kDB * 64 + e] = item[u * kDB * 64 + e];
    }
    return;
  }
  update_prefill(item, item + kLk * kHd, q, state, q_pos0, (t - n_q) * kLk);
}

extern "C" void ATTN_OUT_SYMBOL(float *LLAMA_NPU_RESTRICT state, bfloat16 *LLAMA_NPU_RESTRICT out) {
  const float *l = state_l(state);
  for (int i = 0; i < kLq; ++i)
    for (int d = 0; d < kHd; ++d) {
      const long idx = static_cast<long>(i) * kHd + d;
      out[idx] = f32_to_bf16(l[i] > 0.0f ? state[idx] / l[i] : 0.0f);
    }
  reset_state(state);  // ready for the next query block
}

#endif  // __AIENGINE__
