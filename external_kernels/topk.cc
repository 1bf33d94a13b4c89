// Top-k of one logits partition merged with the running candidates (greedy decode: k = 1, an argmax).
//   logits: bf16 [TOPK_N] (the rows [TOPK_BASE, TOPK_BASE + TOPK_N) of the vocabulary; rows >= TOPK_VALID are
//           padding and never win), prev / out: i32 [2 * TOPK_K] = TOPK_K ids then their f32 values (bit
//           patterns), sorted by value descending, ties by the smaller id; an empty slot has id -1.
// The order is np.argmax's: the first maximum wins (ids are visited in increasing order, prev holds smaller ids,
// and only a strictly larger value displaces a kept one).
// Compiled once per shape with -DTOPK_N -DTOPK_K -DTOPK_BASE -DTOPK_VALID -DTOPK_BLOCK -DTOPK_SYMBOL.
#include "kernel_common.h"

#if !defined(TOPK_N) || !defined(TOPK_K) || !defined(TOPK_BASE) || !defined(TOPK_VALID) || \
    !defined(TOPK_BLOCK) || !defined(TOPK_SYMBOL)
#error "compile with -DTOPK_N -DTOPK_K -DTOPK_BASE -DTOPK_VALID -DTOPK_BLOCK -DTOPK_SYMBOL (kernel_builder/topk)"
#endif
LLAMA_NPU_REQUIRE(TOPK_N);
LLAMA_NPU_REQUIRE(TOPK_K);
LLAMA_NPU_REQUIRE(TOPK_VALID);
LLAMA_NPU_REQUIRE(TOPK_BLOCK);
static_assert(TOPK_VALID <= TOPK_N, "TOPK_VALID must be <= TOPK_N");
static_assert(TOPK_N % TOPK_BLOCK == 0, "TOPK_BLOCK must divide TOPK_N");

namespace {

struct Cands {
  int32_t id[TOPK_K];
  float val[TOPK_K];
  int32_t key[TOPK_K];   // order key of val (key_of): compared as integers, no float compare per element
  int count;
};

static inline float bits_to_f32(int32_t b) {
  float f;
  __builtin_memcpy(&f, &b, 4);
  return f;
}

static inline int32_t f32_to_bits(float f) {
  int32_t b;
  __builtin_memcpy(&b, &f, 4);
  return b;
}

// An integer whose order is the float order of a non-NaN f32 (sign-magnitude -> two's complement order; -0 and
// +0 are one key, as they compare equal).
static inline int32_t key_of_bits(int32_t b) {
  return b >= 0 ? b : (b == INT32_MIN ? 0 : (int32_t)(b ^ 0x7FFFFFFF));
}

static inline void load_prev(const int32_t *prev, Cands &c) {
  c.count = 0;
  for (int i = 0; i < TOPK_K; ++i) {
    c.id[i] = prev[i];
    c.val[i] = bits_to_f32(prev[TOPK_K + i]);
    c.key[i] = key_of_bits(prev[TOPK_K + i]);
    if (prev[i] >= 0) c.count = i + 1;
  }
}

// Insert (id, bf16 bits) when it belongs in the kept k: after every kept value >= it (ties: the earlier, smaller
// id stays first). A bf16's f32 bits are its 16 bits shifted left by 16.
static inline void offer(Cands &c, int32_t id, uint16_t bits) {
  const int32_t b = (int32_t)((uint32_t)bits << 16);
  const int32_t key = key_of_bits(b);
  if (c.count == TOPK_K && !(key > c.key[TOPK_K - 1])) return;
  int i = c.count < TOPK_K ? c.count++ : TOPK_K - 1;
  while (i > 0 && c.key[i - 1] < key) {
    c.id[i] = c.id[i - 1];
    c.val[i] = c.val[i - 1];
    c.key[i] = c.key[i - 1];
    --i;
  }
  c.id[i] = id;
  c.val[i] = bits_to_f32(b);
  c.key[i] = key;
}

static inline void scan(Cands &c, const bfloat16 *x, int lo, int hi) {
  const uint16_t *bits = reinterpret_cast<const uint16_t *>(x);
  for (int i = lo; i < hi; ++i) offer(c, TOPK_BASE + i, bits[i]);
}

static inline void store_out(const Cands &c, int32_t *out) {
  for (int i = 0; i < TOPK_K; ++i) {
    out[i] = i < c.count ? c.id[i] : -1;
    out[TOPK_K + i] = f32_to_bits(i < c.count ? c.val[i] : -__builtin_inff());
  }
}

}  // namespace

#if defined(__AIENGINE__)

// Per block of TOPK_BLOCK logits: the lane-wise max of its 32-lane vectors, widened to f32 and reduced to one
// value; only a block whose max would enter the kept k is scanned element by element, on the bf16 bit patterns
// with integer compares (after the first blocks a rare event: the k-th best only grows).
static constexpr int kLanes = 32;
static_assert(TOPK_BLOCK % kLanes == 0, "TOPK_BLOCK must be a multiple of 32 on AIE2P");

extern "C" void TOPK_SYMBOL(bfloat16 *LLAMA_NPU_RESTRICT logits, int32_t *LLAMA_NPU_RESTRICT prev,
                            int32_t *LLAMA_NPU_RESTRICT out) {
  Cands c;
  load_prev(prev, c);
  constexpr int full = TOPK_VALID / TOPK_BLOCK * TOPK_BLOCK;
  for (int b = 0; b < full; b += TOPK_BLOCK) {
    ::aie::vector<bfloat16, kLanes> m = ::aie::load_v<kLanes>(logits + b);
    for (int j = kLanes; j < TOPK_BLOCK; j += kLanes) m = ::aie::max(m, ::aie::load_v<kLanes>(logits + b + j));
    ::aie::accum<accfloat, kLanes> a;
    a.from_vector(m);
    const float bmax = ::aie::reduce_max(a.template to_vector<float>());
    if (c.count < TOPK_K || bmax > c.val[TOPK_K - 1]) scan(c, logits, b, b + TOPK_BLOCK);
  }
  scan(c, logits, full, TOPK_VALID);
  store_out(c, out);
}

#else

extern "C" void TOPK_SYMBOL(bfloat16 *LLAMA_NPU_RESTRICT logits, int32_t *LLAMA_NPU_RESTRICT prev,
                            int32_t *LLAMA_NPU_RESTRICT out) {
  Cands c;
  load_prev(prev, c);
  scan(c, logits, 0, TOPK_VALID);
  store_out(c, out);
}

#endif
