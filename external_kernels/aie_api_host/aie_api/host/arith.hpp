// Host aie_api, part 3: element-wise arithmetic, reductions and the non-linear functions. See
// docs/aie-api-host.md for the numerics (f32 accumulation, RNE; where the chip differs).
#pragma once

#include "vector.hpp"

namespace aie {
namespace detail_host {

// Legal element-wise multiplies on AIE2P: bf16 x bf16 -> accfloat (native, aie_api aie2p/mul_acc32_fp.hpp:15-16)
// and float x float -> accfloat (emulated with bf16 products, mul_acc32_fp.hpp:84 and :97; mmul.hpp:198 note d).
// Mixed bf16 x float has no implementation: a compile error here as there.
template <typename A, typename B>
constexpr void check_mul_types() {
  static_assert(std::is_same_v<A, B> && aie_host::is_elem_v<A>,
                "aie::mul/mac/msc: AIE2P multiplies bfloat16 x bfloat16 or float x float into accfloat, "
                "not mixed types");
}

template <typename T, unsigned N>
void count_mul() {
  if constexpr (std::is_same_v<T, bfloat16>)
    aie_host::count(aie_host::k_vmac_bf16, (N + 63) / 64);
  else
    aie_host::count(aie_host::k_vmul_f32_emulated, (N + 15) / 16);
}

// acc (+|-) a * b per lane; `sign` 0: product only, +1: mac, -1: msc. bf16 x bf16 products are exact in f32, so
// a bf16 mac rounds once (the add); an f32 product is rounded to f32 first (the chip's emulation differs in the
// last bits: docs/aie-api-host.md).
template <typename T, unsigned N, typename Get>
accum<accfloat, N> mul_core(const accum<accfloat, N> *acc, int sign, const vector<T, N> &a, Get b) {
  count_mul<T, N>();
  accum<accfloat, N> r;
  for (unsigned i = 0; i < N; ++i) {
    const float p = aie_host::widen(a.d[i]) * aie_host::widen(b(i));
    r.d[i] = sign == 0 ? p : sign > 0 ? acc->d[i] + p : acc->d[i] - p;
  }
  return r;
}
}  // namespace detail_host

// aie_api aie.hpp:4566 (vector x vector) and :4698 (vector x scalar)
template <typename A, typename B, unsigned N>
accum<accfloat, N> mul(const vector<A, N> &a, const vector<B, N> &b) {
  detail_host::check_mul_types<A, B>();
  return detail_host::mul_core<A, N>(nullptr, 0, a, [&](unsigned i) { return b.d[i]; });
}
template <typename A, typename E, unsigned N>
accum<accfloat, N> mul(const vector<A, N> &a, E b) {
  detail_host::check_mul_types<A, E>();
  return detail_host::mul_core<A, N>(nullptr, 0, a, [&](unsigned) { return b; });
}

// aie_api aie.hpp:4849 / :4987 (mac), :5055 / :5117 (msc)
template <unsigned N, typename A, typename B>
accum<accfloat, N> mac(const accum<accfloat, N> &acc, const vector<A, N> &a, const vector<B, N> &b) {
  detail_host::check_mul_types<A, B>();
  return detail_host::mul_core<A, N>(&acc, 1, a, [&](unsigned i) { return b.d[i]; });
}
template <unsigned N, typename A, typename E>
accum<accfloat, N> mac(const accum<accfloat, N> &acc, const vector<A, N> &a, E b) {
  detail_host::check_mul_types<A, E>();
  return detail_host::mul_core<A, N>(&acc, 1, a, [&](unsigned) { return b; });
}
template <unsigned N, typename A, typename B>
accum<accfloat, N> msc(const accum<accfloat, N> &acc, const vector<A, N> &a, const vector<B, N> &b) {
  detail_host::check_mul_types<A, B>();
  return detail_host::mul_core<A, N>(&acc, -1, a, [&](unsigned i) { return b.d[i]; });
}

// aie_api aie.hpp:3774 / :4417 (accumulator +/- accumulator), :3816 (accumulator + vector)
template <unsigned N>
accum<accfloat, N> add(const accum<accfloat, N> &x, const accum<accfloat, N> &y) {
  aie_host::count(aie_host::k_vadd_acc);
  accum<accfloat, N> r;
  for (unsigned i = 0; i < N; ++i) r.d[i] = x.d[i] + y.d[i];
  return r;
}
template <unsigned N>
accum<accfloat, N> sub(const accum<accfloat, N> &x, const accum<accfloat, N> &y) {
  aie_host::count(aie_host::k_vadd_acc);
  accum<accfloat, N> r;
  for (unsigned i = 0; i < N; ++i) r.d[i] = x.d[i] - y.d[i];
  return r;
}
template <unsigned N, typename T>
accum<accfloat, N> add(const accum<accfloat, N> &x, const vector<T, N> &y) {
  return add(x, accum<accfloat, N>(y));
}
template <unsigned N, typename T>
accum<accfloat, N> sub(const accum<accfloat, N> &x, const vector<T, N> &y) {
  return sub(x, accum<accfloat, N>(y));
}

// aie_api aie.hpp:1975
template <typename T, unsigned N>
vector<T, N> max(const vector<T, N> &a, const vector<T, N> &b) {
  aie_host::count(aie_host::k_vmax);
  vector<T, N> r;
  for (unsigned i = 0; i < N; ++i)
    r.d[i] = aie_host::widen(a.d[i]) >= aie_host::widen(b.d[i]) ? a.d[i] : b.d[i];
  return r;
}

// aie_api aie.hpp:4189 (reduce_add) and :2111 (reduce_max). The sum is modelled as a halving tree (lanes i and
// i + N/2 added, repeated): the order of a shuffle-and-add reduction, f32 rounding at each add.
template <unsigned N>
float reduce_add(const vector<float, N> &v) {
  aie_host::count(aie_host::k_reduce_add);
  float t[N];
  for (unsigned i = 0; i < N; ++i) t[i] = v.d[i];
  for (unsigned h = N / 2; h >= 1; h /= 2)
    for (unsigned i = 0; i < h; ++i) t[i] = t[i] + t[i + h];
  return t[0];
}
template <unsigned N>
float reduce_max(const vector<float, N> &v) {
  aie_host::count(aie_host::k_reduce_max);
  float m = v.d[0];
  for (unsigned i = 1; i < N; ++i) m = v.d[i] > m ? v.d[i] : m;
  return m;
}

// exp2 and tanh: f32 in, bf16 out, 16 lanes per instruction (aie_api aie.hpp:7750 / :7735;
// aie2p/elementary.hpp:371 / :343). exp2: the input keeps 11 fractional bits, the rest truncated (AMD's AI
// Engine-ML v2 intrinsics guide, VEXP2; modelled as floor to a multiple of 2^-11), then 2^x is computed in f32
// and rounded to bf16 with the core's rounding mode. tanh: f32 tanh rounded to bf16. The chip's function units
// approximate further (not IEEE; about one bf16 ulp): not modelled.
template <typename TR, unsigned N>
vector<TR, N> exp2(const vector<float, N> &v) {
  static_assert(std::is_same_v<TR, bfloat16>, "aie::exp2: AIE2P returns bfloat16 (aie.hpp:7748)");
  aie_host::count(aie_host::k_exp2, (N + 15) / 16);
  vector<TR, N> r;
  for (unsigned i = 0; i < N; ++i) {
    const float x = std::isfinite(v.d[i]) ? std::floor(v.d[i] * 2048.0f) / 2048.0f : v.d[i];
    r.d[i] = aie_host::narrow<TR>(std::exp2(x));
  }
  return r;
}
template <typename TR, unsigned N>
vector<TR, N> tanh(const vector<float, N> &v) {
  static_assert(std::is_same_v<TR, bfloat16>, "aie::tanh: AIE2P returns bfloat16 here (elementary.hpp:343)");
  aie_host::count(aie_host::k_tanh, (N + 15) / 16);
  vector<TR, N> r;
  for (unsigned i = 0; i < N; ++i) r.d[i] = aie_host::narrow<TR>(std::tanh(v.d[i]));
  return r;
}

// Vector reciprocal of bf16 lanes (aie_api aie.hpp:6977, aie2p/elementary.hpp:196: an initial guess refined by a
// polynomial step). Modelled as 1/x rounded to bf16; the kernels refine it with an f32 Newton step.
template <unsigned N>
vector<bfloat16, N> inv(const vector<bfloat16, N> &v) {
  aie_host::count(aie_host::k_inv, (N + 31) / 32);
  vector<bfloat16, N> r;
  for (unsigned i = 0; i < N; ++i) r.d[i] = aie_host::narrow<bfloat16>(1.0f / static_cast<float>(v.d[i]));
  return r;
}

// Scalar invsqrt of a float (aie_api aie.hpp:6854, aie2p/elementary.hpp:492). Modelled as 1/sqrt in f32.
inline float invsqrt(float x) {
  aie_host::count(aie_host::k_invsqrt_scalar);
  return 1.0f / std::sqrt(x);
}

}  // namespace aie
