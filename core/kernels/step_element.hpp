// The step of one vector of elements, for every optimizer: the per-element operation sequence that libzero
// promises bit for bit. It is written once, over a vector abstraction V (one element per "vector" on the GPU and on
// the portable CPU path, 8 or 16 on the SIMD paths), and compiled for the CPU (optim/kernel_body.hpp's loops) and,
// in the CUDA build, for the GPU (cuda/step_kernels.cu): the CPU tests that compare every path with the portable
// one and with the tests' references therefore pin the GPU's arithmetic as well.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/kernels.hpp"
#include "numeric/dtype.hpp"
#include "numeric/host_device.hpp"

// The per-vector pieces must inline into the loops (on the GPU, into the kernel).
#define ZERO_KERNEL_INLINE ZERO_HD_FORCEINLINE

namespace zero {
namespace kernel_detail {

template <class V, DType G>
ZERO_KERNEL_INLINE typename V::F load_grad(const void* grad, size_t i) {
  if constexpr (G == DType::kF32) return V::load(static_cast<const float*>(grad) + i);
  if constexpr (G == DType::kBF16) return V::load_bf16(static_cast<const uint16_t*>(grad) + i);
  if constexpr (G == DType::kF16) return V::load_fp16(static_cast<const uint16_t*>(grad) + i);
}

template <class V, CopyMode C>
ZERO_KERNEL_INLINE void store_copy(void* copy, size_t i, typename V::F p, const KernelArgs& a) {
  if constexpr (C == CopyMode::kBf16Rne) V::store_bf16_rne(static_cast<uint16_t*>(copy) + i, p);
  if constexpr (C == CopyMode::kBf16Stochastic)
    V::store_bf16_sr(static_cast<uint16_t*>(copy) + i, p, a.s.seed, static_cast<uint32_t>(a.first_index + i));
  if constexpr (C == CopyMode::kFp16Rne) V::store_fp16_rne(static_cast<uint16_t*>(copy) + i, p);
}

// The sum of squares in fp64 over 16 lanes — element i goes to lane i mod 16 — combined at the end by one fixed
// tree (lane j plus lane j + 8, then pairwise). Every SIMD path keeps exactly these 16 sums (AVX-512 in two
// registers, AVX2 in four, the scalar path in an array), so the result is bit-identical whatever the path, and a
// run's sum depends only on its elements.
constexpr size_t kSquareLanes = 16;

// Which of the 16 lanes' vectors element i's vector feeds: i counts from the start of a block of the norm.
template <class V>
ZERO_KERNEL_INLINE size_t square_part(size_t i) {
  return (i % kSquareLanes) / V::W;
}

// SGD's per-step variants, as compile-time flags so that the loop carries no branch: momentum != 0 (a momentum
// buffer exists), the first step (the buffer starts as the gradient), Nesterov.
constexpr int kSgdMomentum = 1, kSgdFirstStep = 2, kSgdNesterov = 4;

// The variant a run of SGD takes: momentum when it has a momentum buffer, then the step's and the group's flags.
// Both the CPU loops and the GPU launches choose their compiled loop by it (0 for every other optimizer).
inline int sgd_variant(OptimizerKind kind, const KernelArgs& a) {
  if (kind != OptimizerKind::kSgd || a.state0 == nullptr) return 0;
  return kSgdMomentum | (a.s.first_step ? kSgdFirstStep : 0) | (a.s.e != 0.0f ? kSgdNesterov : 0);
}

// One vector of each optimizer. `a` points at the streams; i is the element offset. With kNorm the squares of the
// gradient as read go to `acc` (vector `part` of its 16 lanes), exactly as sum_squares_kernel adds them.
template <class V, OptimizerKind K, DType G, CopyMode C, int kSgd, bool kNorm>
ZERO_KERNEL_INLINE void step_vector(const KernelArgs& a, size_t i, typename V::D& acc, size_t part) {
  using F = typename V::F;
  const StepScalars& s = a.s;
  F p = V::load(a.master + i);
  const F raw = load_grad<V, G>(a.grad, i);
  if constexpr (kNorm) acc = V::accumulate_squares(acc, raw, part);
  F g = V::mul(V::div(raw, V::set1(s.grad_divisor)), V::set1(s.grad_clip));
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
    if constexpr ((kSgd & kSgdMomentum) != 0) {
      F buf = (kSgd & kSgdFirstStep) != 0
                  ? g
                  : V::add(V::mul(V::set1(s.a), V::load(a.state0 + i)), V::mul(V::set1(s.b), g));
      V::store(a.state0 + i, buf);
      g = (kSgd & kSgdNesterov) != 0 ? V::add(g, V::mul(V::set1(s.a), buf)) : buf;
    }
    p = V::sub(p, V::mul(V::set1(s.c), g));
  }
  V::store(a.master + i, p);
  store_copy<V, C>(a.copy, i, p, a);
}

}  // namespace kernel_detail
}  // namespace zero
