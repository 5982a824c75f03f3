// The optimizer kernels, written once over a SIMD abstraction V and instantiated per path by kernels_<isa>.cpp.
// V provides: W (lanes), F (float vector), load/store/set1/add/sub/mul/div/sqrt/sign_times, load_bf16/load_fp16,
// store_bf16_rne/store_bf16_sr/store_fp16_rne, and a double accumulator for the sum of squares.
//
// Tails are computed by the same vector code on a zero-padded copy of the last partial vector, so an element's
// result never depends on whether it sits in the body or the tail of a run.
#pragma once

#include <cstring>

#include "optim/kernels.hpp"

namespace zero {
namespace kernel_detail {

template <class V, DType G>
inline typename V::F load_grad(const void* grad, size_t i) {
  if constexpr (G == DType::kF32) return V::load(static_cast<const float*>(grad) + i);
  if constexpr (G == DType::kBF16) return V::load_bf16(static_cast<const uint16_t*>(grad) + i);
  if constexpr (G == DType::kF16) return V::load_fp16(static_cast<const uint16_t*>(grad) + i);
}

template <class V, CopyMode C>
inline void store_copy(void* copy, size_t i, typename V::F p, const KernelArgs& a) {
  if constexpr (C == CopyMode::kBf16Rne) V::store_bf16_rne(static_cast<uint16_t*>(copy) + i, p);
  if constexpr (C == CopyMode::kBf16Stochastic)
    V::store_bf16_sr(static_cast<uint16_t*>(copy) + i, p, a.s.seed, static_cast<uint32_t>(a.first_index + i));
  if constexpr (C == CopyMode::kFp16Rne) V::store_fp16_rne(static_cast<uint16_t*>(copy) + i, p);
}

// One vector of each optimizer. `a` points at the streams; i is the element offset.
template <class V, OptimizerKind K, DType G, CopyMode C>
inline void step_vector(const KernelArgs& a, size_t i) {
  using F = typename V::F;
  const StepScalars& s = a.s;
  F p = V::load(a.master + i);
  F g = V::mul(load_grad<V, G>(a.grad, i), V::set1(s.grad_factor));
  if constexpr (K == OptimizerKind::kAdamW || K == OptimizerKind::kAdamL2) {
    if constexpr (K == OptimizerKind::kAdamL2) g = V::add(g, V::mul(V::set1(s.h), p));
    F m = V::add(V::mul(V::set1(s.a), V::load(a.state0 + i)), V::mul(V::set1(s.b), g));
    F v = V::add(V::mul(V::set1(s.c), V::load(a.state1 + i)), V::mul(V::set1(s.d), V::mul(g, g)));
    F denom = V::add(V::mul(V::sqrt(v), V::set1(s.f)), V::set1(s.g));
    if constexpr (K == OptimizerKind::kAdamW) p = V::mul(p, V::set1(s.i));
    p = V::sub(p, V::mul(V::set1(s.e), V::div(m, denom)));
    V::store(a.state0 + i, m);
    V::store(a.state1 + i, v);
  } else if constexpr (K == OptimizerKind::kAdagrad) {
    g = V::add(g, V::mul(V::set1(s.c), p));
    F sum = V::add(V::load(a.state0 + i), V::mul(g, g));
    F denom = V::add(V::sqrt(sum), V::set1(s.b));
    p = V::sub(p, V::mul(V::set1(s.a), V::div(g, denom)));
    V::store(a.state0 + i, sum);
  } else if constexpr (K == OptimizerKind::kLion) {
    F m = V::load(a.state0 + i);
    F update = V::add(V::mul(V::set1(s.a), m), V::mul(V::set1(s.b), g));
    p = V::mul(p, V::set1(s.f));
    p = V::sub(p, V::sign_times(update, V::set1(s.e)));
    m = V::add(V::mul(V::set1(s.c), m), V::mul(V::set1(s.d), g));
    V::store(a.state0 + i, m);
  } else if constexpr (K == OptimizerKind::kSgd) {
    g = V::add(g, V::mul(V::set1(s.d), p));
    if (a.state0 != nullptr) {  // momentum != 0
      F buf = s.first_step ? g : V::add(V::mul(V::set1(s.a), V::load(a.state0 + i)), V::mul(V::set1(s.b), g));
      V::store(a.state0 + i, buf);
      g = s.e != 0.0f ? V::add(g, V::mul(V::set1(s.a), buf)) : buf;
    }
    p = V::sub(p, V::mul(V::set1(s.c), g));
  }
  V::store(a.master + i, p);
  store_copy<V, C>(a.copy, i, p, a);
}

template <class V, OptimizerKind K, DType G, CopyMode C>
void step_kernel(const KernelArgs& args) {
  constexpr size_t W = V::W;
  // A local copy: the stores through its float pointers cannot alias it, so the compiler keeps the pointers and
  // the broadcast constants in registers instead of reloading them after every store.
  const KernelArgs local = args;
  const size_t body = local.n / W * W;
  // (Unrolling by two vectors was measured: no gain on AVX-512, a loss on AVX2.)
  for (size_t i = 0; i < body; i += W) step_vector<V, K, G, C>(local, i);
  const size_t tail = args.n - body;
  if (tail == 0) return;
  // The last partial vector, on zero-padded copies of every stream.
  alignas(64) float master[W] = {}, s0[W] = {}, s1[W] = {};
  alignas(64) uint32_t grad[W] = {};  // big enough for W elements of any grad dtype
  alignas(64) uint16_t copy[W] = {};
  const size_t gsize = dtype_size(G);
  KernelArgs t = args;
  t.master = master;
  std::memcpy(master, args.master + body, tail * sizeof(float));
  t.grad = grad;
  std::memcpy(grad, static_cast<const char*>(args.grad) + body * gsize, tail * gsize);
  if (args.state0) t.state0 = s0, std::memcpy(s0, args.state0 + body, tail * sizeof(float));
  if (args.state1) t.state1 = s1, std::memcpy(s1, args.state1 + body, tail * sizeof(float));
  if (args.copy) t.copy = copy;
  t.first_index = args.first_index + body;
  step_vector<V, K, G, C>(t, 0);
  std::memcpy(args.master + body, master, tail * sizeof(float));
  if (args.state0) std::memcpy(args.state0 + body, s0, tail * sizeof(float));
  if (args.state1) std::memcpy(args.state1 + body, s1, tail * sizeof(float));
  if (args.copy) std::memcpy(static_cast<uint16_t*>(args.copy) + body, copy, tail * sizeof(uint16_t));
}

template <class V, DType G>
double sum_squares_kernel(const void* grad, size_t n) {
  constexpr size_t W = V::W;
  typename V::D acc = V::dzero();
  const size_t body = n / W * W;
  for (size_t i = 0; i < body; i += W) acc = V::accumulate_squares(acc, load_grad<V, G>(grad, i));
  if (body < n) {
    alignas(64) uint32_t tail[W] = {};
    std::memcpy(tail, static_cast<const char*>(grad) + body * dtype_size(G), (n - body) * dtype_size(G));
    acc = V::accumulate_squares(acc, load_grad<V, G>(tail, 0));
  }
  return V::dsum(acc);
}

template <class V, OptimizerKind K, DType G>
void fill_copy_modes(KernelTable& t) {
  t.step[static_cast<int>(K)][static_cast<int>(G)][0] = step_kernel<V, K, G, CopyMode::kNone>;
  t.step[static_cast<int>(K)][static_cast<int>(G)][1] = step_kernel<V, K, G, CopyMode::kBf16Rne>;
  t.step[static_cast<int>(K)][static_cast<int>(G)][2] = step_kernel<V, K, G, CopyMode::kBf16Stochastic>;
  t.step[static_cast<int>(K)][static_cast<int>(G)][3] = step_kernel<V, K, G, CopyMode::kFp16Rne>;
}

template <class V, OptimizerKind K>
void fill_grad_dtypes(KernelTable& t) {
  fill_copy_modes<V, K, DType::kF32>(t);
  fill_copy_modes<V, K, DType::kBF16>(t);
  fill_copy_modes<V, K, DType::kF16>(t);
}

template <class V>
KernelTable make_table() {
  KernelTable t{};
  fill_grad_dtypes<V, OptimizerKind::kAdamW>(t);
  fill_grad_dtypes<V, OptimizerKind::kAdamL2>(t);
  fill_grad_dtypes<V, OptimizerKind::kAdagrad>(t);
  fill_grad_dtypes<V, OptimizerKind::kLion>(t);
  fill_grad_dtypes<V, OptimizerKind::kSgd>(t);
  t.sum_squares[0] = sum_squares_kernel<V, DType::kF32>;
  t.sum_squares[1] = sum_squares_kernel<V, DType::kBF16>;
  t.sum_squares[2] = sum_squares_kernel<V, DType::kF16>;
  return t;
}

}  // namespace kernel_detail
}  // namespace zero
