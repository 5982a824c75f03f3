// Which pass sums the squares of the gradient norm (docs/architecture.md, "The norm inside the update" and "The norm
// inside the reduction"), decided once at finalize for every unit. The norm's bits are the same whichever pass sums
// them (the same blocks, lanes and order), so each rank decides alone:
//  - in the update: nothing decides with the norm before the update (no clipping, no skip of a non-finite step), so
//    the optimizer pass sums the squares of the gradients it reads — where it reads exactly the norm's runs;
//  - in the reduction: the norm is needed first, and the pass that writes a unit's final reduced values (the bucket
//    accumulation of the window's last micro-step at stages 2-3, the widening after a narrower communication dtype
//    at stages 0-1) sums them block by block from cache — and stage 0 at N > 1 always, since its optimizer pass
//    updates more than the rank's norm shard;
//  - else a pass of its own before the update (Stepper::local_sum_squares) — always on a device.
#pragma once

#include <cstddef>
#include <vector>

#include "plan/layout.hpp"
#include "plan/plan.hpp"

namespace zero {

class Unit;

struct NormSettings {
  bool needed_first = true;  // gradient clipping, or the skip of a non-finite step, decides with the norm
  bool widened = false;      // the reductions run in a dtype narrower than the accumulation dtype
  // With a model-parallel group: the params marked ZERO_PARAM_MODEL_PARALLEL_DUPLICATE, which another rank counts,
  // are left out of this rank's norm.
  bool leave_out_duplicates = false;
  // The gradients are in device memory: the norm is a device pass of its own (the device's fused step and its
  // reductions do not sum squares as they go).
  bool on_device = false;
};

class NormPlan {
 public:
  NormPlan() = default;
  NormPlan(const Plan& plan, const Layout& layout, const std::vector<Unit>& units, const NormSettings& settings,
           bool state_on_nvme);

  // The optimizer pass sums every unit's squares.
  bool in_update() const { return in_update_; }
  // The reduction's last pass sums unit u's squares (when its final values come from such a pass).
  bool in_reduction(int unit) const { return in_reduction_[static_cast<size_t>(unit)] != 0; }
  // Scratch sizes: the norm's blocks of the longest segment, and of the unit with the most that folds.
  size_t largest_segment_blocks() const { return largest_segment_blocks_; }
  size_t most_folded_blocks() const { return most_folded_blocks_; }

 private:
  bool in_update_ = false;
  std::vector<char> in_reduction_;
  size_t largest_segment_blocks_ = 0;
  size_t most_folded_blocks_ = 0;
};

}  // namespace zero
