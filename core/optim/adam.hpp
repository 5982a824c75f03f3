// Adam and AdamW over a contiguous run of one param group's elements (a plain loop; the fused SIMD kernels are
// separate work). Per-step scalars are computed once in double and rounded to float, then every element goes
// through the same float operation sequence, so an element's result does not depend on where it sits in a
// shard, and a reference written in the same order matches bit for bit.
#pragma once

#include <cstddef>
#include <cstdint>

namespace zero {

struct AdamHyper {
  bool decoupled_weight_decay = true;  // AdamW; false: L2 (weight decay added to the gradient)
  bool bias_correction = true;
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
};

// Updates params, m and v in place. `grad_factor` multiplies every gradient first (averaging and clipping folded
// into one factor). `step` is the 1-based step number, for bias correction.
void adam_update(float* params, const float* grads, float* m, float* v, size_t n_elems, float grad_factor,
                 const AdamHyper& hyper, int64_t step);

}  // namespace zero
