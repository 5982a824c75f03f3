// The step of one vector of elements, for every optimizer: the per-element operation sequence that libzero
// promises bit for bit. It is written once, over a vector abstraction V (one element per "vector" on the GPU and on
// the portable CPU path, 8 or 16 on the SIMD paths), and compiled for the CPU (kernels/cpu_loops.hpp's loops) and,
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

// SGD's per-step variants: momentum != 0 (a momentum buffer exists), the first step (the buffer starts as the
// gradient), Nesterov. Both the CPU loops and the GPU launches find a run's variant here (0 for every other
// optimizer); the GPU compiles one kernel per variant, the CPU loops read the flags as they go.
constexpr int kSgdMomentum = 1, kSgdFirstStep = 2, kSgdNesterov = 4;
inline int sgd_variant(OptimizerKind kind, const KernelArgs& a) {
  if (kind != OptimizerKind::kSgd || a.state0 == nullptr) return 0;
  return kSgdMomentum | (a.s.sgd.first_step ? kSgdFirstStep : 0) | (a.s.sgd.nesterov ? kSgdNesterov : 0);
}

// What varies within one optimizer and gradient dtype: how the compute-dtype copy is written and SGD's variant,
// fixed at compile time (one loop per combination: a test per vector costs a cheap kernel, SGD's or Lion's, up to
// half its speed once the data is in cache), and whether the squares of the gradients are summed as they are read,
// decided per run on the CPU (a predictable test per vector, measured as free, where the compiled loop would be
// the whole loop again) and fixed on the GPU.
template <CopyMode C, int kSgd>
struct CopyAndSgd {
  ZERO_KERNEL_INLINE static constexpr CopyMode copy() { return C; }
  ZERO_KERNEL_INLINE static constexpr bool momentum() { return (kSgd & kSgdMomentum) != 0; }
  ZERO_KERNEL_INLINE static constexpr bool first_step() { return (kSgd & kSgdFirstStep) != 0; }
  ZERO_KERNEL_INLINE static constexpr bool nesterov() { return (kSgd & kSgdNesterov) != 0; }
};
// The GPU's: everything fixed.
template <CopyMode C, int kSgd, bool kNorm>
struct FixedVariant : CopyAndSgd<C, kSgd> {
  ZERO_KERNEL_INLINE static constexpr bool norm() { return kNorm; }
};
// The CPU loops': the norm decided per run.
template <CopyMode C, int kSgd>
struct RunVariant : CopyAndSgd<C, kSgd> {
  bool sum_squares = false;
  ZERO_KERNEL_INLINE bool norm() const { return sum_squares; }
};

template <class V, class Variant>
ZERO_KERNEL_INLINE void store_copy(void* copy, size_t i, typename V::F p, const KernelArgs& a, const Variant&) {
  if constexpr (Variant::copy() == CopyMode::kBf16Rne) V::store_bf16_rne(static_cast<uint16_t*>(copy) + i, p);
  if constexpr (Variant::copy() == CopyMode::kBf16Stochastic)
    V::store_bf16_sr(static_cast<uint16_t*>(copy) + i, p, a.s.seed, static_cast<uint32_t>(a.first_index + i));
  if constexpr (Variant::copy() == CopyMode::kFp16Rne) V::store_fp16_rne(static_cast<uint16_t*>(copy) + i, p);
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

// One vector of each optimizer, as its paper writes the update. `a` points at the streams; i is the element
// offset. With var.norm() the squares of the gradient as read go to `acc` (vector `part` of its 16 lanes), exactly
// as sum_squares_kernel adds them.
template <class V, OptimizerKind K, DType G, class Variant>
ZERO_KERNEL_INLINE void step_vector(const KernelArgs& a, size_t i, typename V::D& acc, size_t part,
                                    const Variant& var) {
  using F = typename V::F;
  F p = V::load(a.master + i);
  const F raw = load_grad<V, G>(a.grad, i);
  if (var.norm()) acc = V::accumulate_squares(acc, raw, part);
  F g = V::mul(V::div(raw, V::set1(a.s.grad_divisor)), V::set1(a.s.grad_clip));
  if constexpr (K == OptimizerKind::kAdamW || K == OptimizerKind::kAdamL2) {
    const AdamScalars& s = a.s.adam;
    if constexpr (K == OptimizerKind::kAdamL2) g = V::add(g, V::mul(V::set1(s.l2), p));
    F m = V::add(V::mul(V::set1(s.beta1), V::load(a.state0 + i)), V::mul(V::set1(s.one_minus_beta1), g));
    F v = V::add(V::mul(V::set1(s.beta2), V::load(a.state1 + i)), V::mul(V::set1(s.one_minus_beta2), V::mul(g, g)));
    F denom = V::add(V::mul(V::sqrt(v), V::set1(s.inv_sqrt_bias2)), V::set1(s.eps));
    if constexpr (K == OptimizerKind::kAdamW) p = V::mul(p, V::set1(s.decay));
    p = V::sub(p, V::mul(V::set1(s.step_size), V::div(m, denom)));
    V::store(a.state0 + i, m);
    V::store(a.state1 + i, v);
  } else if constexpr (K == OptimizerKind::kAdagrad) {
    const AdagradScalars& s = a.s.adagrad;
    g = V::add(g, V::mul(V::set1(s.l2), p));
    F sum = V::add(V::load(a.state0 + i), V::mul(g, g));
    F denom = V::add(V::sqrt(sum), V::set1(s.eps));
    p = V::sub(p, V::mul(V::set1(s.lr), V::div(g, denom)));
    V::store(a.state0 + i, sum);
  } else if constexpr (K == OptimizerKind::kLion) {
    const LionScalars& s = a.s.lion;
    F m = V::load(a.state0 + i);
    F update = V::add(V::mul(V::set1(s.beta1), m), V::mul(V::set1(s.one_minus_beta1), g));
    p = V::mul(p, V::set1(s.decay));
    p = V::sub(p, V::sign_times(update, V::set1(s.lr)));
    m = V::add(V::mul(V::set1(s.beta2), m), V::mul(V::set1(s.one_minus_beta2), g));
    V::store(a.state0 + i, m);
  } else if constexpr (K == OptimizerKind::kSgd) {
    const SgdScalars& s = a.s.sgd;
    g = V::add(g, V::mul(V::set1(s.l2), p));
    if constexpr (Variant::momentum()) {
      F buf = Variant::first_step() ? g
                                    : V::add(V::mul(V::set1(s.momentum), V::load(a.state0 + i)),
                                             V::mul(V::set1(s.one_minus_dampening), g));
      V::store(a.state0 + i, buf);
      g = Variant::nesterov() ? V::add(g, V::mul(V::set1(s.momentum), buf)) : buf;
    }
    p = V::sub(p, V::mul(V::set1(s.lr), g));
  }
  V::store(a.master + i, p);
  store_copy<V>(a.copy, i, p, a, var);
}

}  // namespace kernel_detail
}  // namespace zero
