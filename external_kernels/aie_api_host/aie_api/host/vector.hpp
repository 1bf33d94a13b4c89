// Host aie_api, part 2: vector, accum, loads/stores, data movement. See docs/aie-api-host.md.
#pragma once

#include "block_float.hpp"
#include "core.hpp"

namespace aie {

// Vector sizes: 8/16/32 bf16 and 4/8/16 float lanes map to one register, larger powers of two to a compound of
// registers (aie_api aie2/vector_native_types.hpp:231-240, used by AIE2P); anything under 128 bits does not exist.
template <typename T, unsigned N>
struct vector {
  static_assert(aie_host::is_elem_v<T> || aie_host::is_int8_lane_v<T>,
                "aie_api_host: only bfloat16, float, int8 and uint8 vectors (and int4/uint4: int4.hpp) are modelled");
  static_assert(sizeof(T) * 8 * N >= 128 && (N & (N - 1)) == 0,
                "aie::vector: an AIE2P vector is a power-of-two number of lanes of at least 128 bits");
  using value_type = T;
  T d[N];

  static constexpr unsigned size() { return N; }
  T get(unsigned i) const { return d[i]; }
  void set(T v, unsigned i) { d[i] = v; }
  T operator[](unsigned i) const { return d[i]; }

  template <unsigned M>
  vector<T, M> extract(unsigned idx) const {  // sub-vector `idx` of size M: a register half/quarter
    static_assert(N % M == 0, "aie::vector::extract: M must divide the size");
    if (idx >= N / M) aie_host::fail("aie_api_host: vector::extract index out of range");
    vector<T, M> r;
    for (unsigned i = 0; i < M; ++i) r.d[i] = d[(idx % (N / M)) * M + i];
    return r;
  }
  template <unsigned M>
  vector<T, M> grow() const {  // upper lanes undefined on the chip: here zero
    static_assert(M >= N && M % N == 0, "aie::vector::grow: M must be a multiple of the size");
    vector<T, M> r{};
    for (unsigned i = 0; i < N; ++i) r.d[i] = d[i];
    return r;
  }
};

template <typename Tag, unsigned N>
struct accum {
  static_assert(std::is_same_v<Tag, accfloat>, "aie_api_host: only accfloat accumulators are modelled");
  static_assert(N >= 8 && (N & (N - 1)) == 0, "aie::accum<accfloat, N>: N must be a power of two >= 8 (256 bits)");
  using value_type = Tag;
  float d[N];

  static constexpr unsigned size() { return N; }
  accum() = default;
  template <typename T>
  explicit accum(const vector<T, N> &v) {  // widening (bf16 -> f32 exact)
    from_vector(v);
  }
  template <typename T>
  void from_vector(const vector<T, N> &v, int shift = 0) {  // shift: integer accumulators only (aie_api)
    if (shift != 0) aie_host::fail("aie_api_host: accum<accfloat>::from_vector takes no shift");
    aie_host::count(aie_host::k_vconvert);
    for (unsigned i = 0; i < N; ++i) d[i] = aie_host::widen(v.d[i]);
  }
  template <typename T>
  auto to_vector() const {  // bf16: rounded with the core's rounding mode; bfp16ebs8: a block vector
    if constexpr (std::is_same_v<T, bfp16ebs8>) {
      return detail_host::to_block_vector<N>(d);
    } else {
      aie_host::count(aie_host::k_vconvert);
      vector<T, N> r;
      for (unsigned i = 0; i < N; ++i) r.d[i] = aie_host::narrow<T>(d[i]);
      return r;
    }
  }
  template <unsigned M>
  accum<Tag, M> extract(unsigned idx) const {
    static_assert(N % M == 0, "aie::accum::extract: M must divide the size");
    accum<Tag, M> r;
    for (unsigned i = 0; i < M; ++i) r.d[i] = d[(idx % (N / M)) * M + i];
    return r;
  }
};

// ----------------------------------------------------------------------------------------------- memory
// vector_decl_align and the load/store alignment rule of AIE2P (__AIE_ARCH__ 21): a 128-bit access needs 16-byte,
// a 256-bit one 32-byte, anything wider 64-byte alignment (aie_api detail/ld_st.hpp:36-41; checked by load_v /
// store_v, aie.hpp:583-590 and 740).
static constexpr unsigned vector_decl_align = 64;
template <typename T, unsigned N>
static constexpr unsigned vector_ldst_align_v = sizeof(T) * N == 16 ? 16 : sizeof(T) * N == 32 ? 32 : 64;

namespace detail_host {
template <typename T, unsigned N>
bool aligned(const void *p, const char *what) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  if (a % vector_ldst_align_v<T, N> == 0) return true;
  char msg[256];
  std::snprintf(msg, sizeof msg,
                "aie_api_host: misaligned %s of %u x %s at %p (offset %u bytes from a %u-byte boundary; AIE2P "
                "needs %u-byte alignment for a %u-bit vector)",
                what, N, std::is_same_v<T, float> ? "float" : "bfloat16", p,
                static_cast<unsigned>(a % vector_ldst_align_v<T, N>), vector_ldst_align_v<T, N>,
                vector_ldst_align_v<T, N>, static_cast<unsigned>(sizeof(T) * 8 * N));
  aie_host::fail(msg);
  return false;
}
}  // namespace detail_host

template <unsigned N, typename T>
vector<std::remove_const_t<T>, N> load_v(T *p) {
  using U = std::remove_const_t<T>;
  vector<U, N> r{};
  aie_host::count(aie_host::k_vload, (sizeof(U) * N + 63) / 64);  // one instruction per 512 bits
  aie_host::count(aie_host::k_vload_bytes, sizeof(U) * N);
  if (detail_host::aligned<U, N>(p, "load_v")) std::memcpy(r.d, p, sizeof(U) * N);
  return r;  // a misaligned load returns zeros (the call is reported as failed)
}

template <typename T, unsigned N>
T *store_v(T *p, const vector<T, N> &v) {
  aie_host::count(aie_host::k_vstore, (sizeof(T) * N + 63) / 64);  // one instruction per 512 bits
  aie_host::count(aie_host::k_vstore_bytes, sizeof(T) * N);
  if (detail_host::aligned<T, N>(p, "store_v")) std::memcpy(p, v.d, sizeof(T) * N);
  return p + N;  // a misaligned store writes nothing
}

// aie_api aie.hpp:633 load_unaligned_v: p need only be aligned to `aligned_elems` elements (a power of two); a
// vector-aligned p is one load, otherwise two aligned loads and a shuffle (aie_api detail/ld_st.hpp).
template <unsigned N, typename T>
vector<std::remove_const_t<T>, N> load_unaligned_v(T *p, unsigned aligned_elems = 1) {
  using U = std::remove_const_t<T>;
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  if (aligned_elems == 0 || (aligned_elems & (aligned_elems - 1)) || a % (aligned_elems * sizeof(U))) {
    aie_host::fail("aie_api_host: load_unaligned_v: pointer not aligned to aligned_elems (a power of two)");
    return vector<U, N>{};
  }
  if (a % vector_ldst_align_v<U, N> == 0) return load_v<N>(p);
  vector<U, N> r;
  aie_host::count(aie_host::k_vload, 2 * ((sizeof(U) * N + 63) / 64));
  aie_host::count(aie_host::k_vload_bytes, 2 * sizeof(U) * N);
  aie_host::count(aie_host::k_shuffle);
  std::memcpy(r.d, p, sizeof(U) * N);
  return r;
}

// ----------------------------------------------------------------------------------------- construction
namespace detail_host {
template <typename T, unsigned N, bool Acc = std::is_same_v<T, accfloat>>
struct zeros_of {
  using type = vector<T, N>;
};
template <typename T, unsigned N>
struct zeros_of<T, N, true> {
  using type = accum<accfloat, N>;
};
}  // namespace detail_host

// aie_api aie.hpp:1136 (vector) and :1156 (accumulator)
template <typename T, unsigned N>
typename detail_host::zeros_of<T, N>::type zeros() {
  typename detail_host::zeros_of<T, N>::type r;
  for (unsigned i = 0; i < N; ++i) r.d[i] = {};
  return r;
}

// aie_api aie.hpp:1111
template <typename T, unsigned N>
vector<T, N> broadcast(T v) {
  aie_host::count(aie_host::k_broadcast);
  vector<T, N> r;
  for (unsigned i = 0; i < N; ++i) r.d[i] = v;
  return r;
}

// aie_api aie.hpp:1048; register concatenation, not counted (no instruction on the chip)
template <typename T, unsigned N, typename... Rest>
vector<T, N *(1 + sizeof...(Rest))> concat(const vector<T, N> &first, const Rest &...rest) {
  static_assert((std::is_same_v<Rest, vector<T, N>> && ...), "aie::concat: all vectors must have the same type");
  vector<T, N *(1 + sizeof...(Rest))> r;
  const vector<T, N> *parts[] = {&first, &rest...};
  for (unsigned p = 0; p < 1 + sizeof...(Rest); ++p)
    for (unsigned i = 0; i < N; ++i) r.d[p * N + i] = parts[p]->d[i];
  return r;
}

// aie_api aie.hpp:1032: accumulators likewise (register concatenation, not counted)
template <typename Tag, unsigned N, typename... Rest>
accum<Tag, N *(1 + sizeof...(Rest))> concat(const accum<Tag, N> &first, const Rest &...rest) {
  static_assert((std::is_same_v<Rest, accum<Tag, N>> && ...), "aie::concat: all accumulators must have the same type");
  accum<Tag, N *(1 + sizeof...(Rest))> r;
  const accum<Tag, N> *parts[] = {&first, &rest...};
  for (unsigned p = 0; p < 1 + sizeof...(Rest); ++p)
    for (unsigned i = 0; i < N; ++i) r.d[p * N + i] = parts[p]->d[i];
  return r;
}

// aie_api aie.hpp:2821: v read as a row-major rows x cols matrix, returned transposed
template <typename T, unsigned N>
vector<T, N> transpose(const vector<T, N> &v, unsigned rows, unsigned cols) {
  if (rows * cols != N) aie_host::fail("aie_api_host: transpose needs rows * cols == vector size");
  aie_host::count(aie_host::k_shuffle);
  vector<T, N> r{};
  for (unsigned i = 0; i < rows && rows * cols == N; ++i)
    for (unsigned j = 0; j < cols; ++j) r.d[j * rows + i] = v.d[i * cols + j];
  return r;
}

// aie_api aie.hpp:7811
inline void set_rounding(rounding_mode m) { aie_host::rounding = m; }

}  // namespace aie
