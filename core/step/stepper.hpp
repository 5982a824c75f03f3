// The stepper: what zero_step computes once the gradients are reduced — this rank's part of the squared norm, the
// norm itself, the clip and loss-scale decisions, each group's learning rate, and the fused optimizer pass over
// the ranges the plan gives this rank (kernels chosen by memory space and SIMD path). It owns the loss scaler,
// the step counter and the per-step scratch, so that zero_step allocates nothing.
#pragma once

#include <functional>
#include <utility>
#include <vector>

#include "config/config.hpp"
#include "cpu_offload/offload_pipeline.hpp"
#include "device/device_memory.hpp"
#include "kernels/kernels.hpp"
#include "params/param_store.hpp"
#include "params/registration.hpp"
#include "step/device_pass.hpp"
#include "step/loss_scaler.hpp"

namespace zero {

struct StepResult {
  int64_t step = 0;
  double grad_norm = 0.0;
  double lr = 0.0;
  double loss_scale = 1.0;
  bool skipped = false;
};

// How zero_step averages the window's gradients (zero_step_options_t), as the caller gave them: 0 or 1, checked by
// zero_step where a rank's bad value reaches the others.
struct StepOptions {
  // 1: step after the micro-steps ended so far (1 to gradient_accumulation_steps: an epoch's remainder), averaging
  // over those; 0: exactly gradient_accumulation_steps must have ended.
  int partial_window = 0;
  // 1: each micro-step's loss was already divided by the window's micro-steps (DeepSpeed's scale_wrt_gas=False):
  // the gradients are averaged over ranks only.
  int loss_averaged = 0;
};

// What the optimizer pass needs from the decision: every gradient is divided by `divisor` (world size x
// accumulation steps x loss scale), then multiplied by `clip`.
struct StepDecision {
  StepResult result;
  double divisor = 1.0;
  double clip = 1.0;
};

class Stepper {
 public:
  Stepper(const Config& config, int rank, int ranks_on_node);

  // A device engine: the norm and the update run on the device through `context` (before allocate).
  void use_device(std::shared_ptr<device::DeviceContext> context) { device_context_ = std::move(context); }
  // ZeRO-Offload's pipeline, through which offloaded units are stepped (null without).
  void set_offload(OffloadPipeline* offload) { offload_ = offload; }
  // finalize: the scratch of the norm and the per-group scalars.
  void allocate(const ParameterStore& store, size_t groups);
  // This rank's sum of squares of its shard of the reduced gradients, in fp64 (also the overflow test: an inf or
  // nan anywhere makes it non-finite; finite fp32 squares cannot overflow fp64).
  // `folded(u)`, where not null, gives unit u's per-segment sums already summed as the gradients were reduced
  // (GradientReducer::folded_squares): the same bits, no pass over the unit.
  double local_sum_squares(ParameterStore& store, const std::function<const double*(int)>& folded = nullptr);
  // From the sum over ranks: the norm, the skip and loss-scale decisions, the clip, the learning rate of group 0.
  // The gradients are the sum over `world_size` ranks and `micro_steps` micro-steps (1 where each micro-step's
  // loss was already averaged).
  StepDecision decide(double sum_sq, int world_size, int64_t micro_steps, const std::vector<GroupSpec>& groups);
  // The fused optimizer pass over every unit's update range (counts the step); with `clear_grads` it zeroes the
  // gradients it reads (GradientReducer::clear_in_update). With `sum_sq` it also adds this rank's sum of squares
  // there, the bits local_sum_squares gives (where the store's NormPlan sums the norm in the update).
  void update(ParameterStore& store, const std::vector<GroupSpec>& groups, const StepDecision& decision,
              bool clear_grads, double* sum_sq = nullptr);
  // The norm of the averaged gradients from the sum over ranks of the squares, as decide computes it.
  static double norm_from(double sum_sq, const StepDecision& decision);
  // After the step: a skipped step is logged, and too many in a row end the run (throws).
  void account(const StepResult& result);

  int64_t steps() const { return steps_; }
  // The learning rate the next step gives a group whose base rate is `base_lr`.
  double next_lr(double base_lr) const;
  void set_steps(int64_t steps) { steps_ = steps; }
  double loss_scale() const { return scaler_.scale(); }
  LossScaler::State scaler_state() const { return scaler_.state(); }
  void restore_scaler(const LossScaler::State& s) { scaler_.restore(s); }
  Isa isa() const { return isa_; }
  int threads() const { return threads_; }
  void set_threads(int requested);  // 0: automatic

 private:
  CopyMode copy_mode() const;
  double device_sum_squares(ParameterStore& store);
  void update_offloaded(ParameterStore& store, int u, const UpdateView& view, bool clear_grads);

  const Config& config_;
  Isa isa_;
  int rank_ = 0;
  int ranks_on_node_ = 1;
  int threads_ = 1;                        // optimizer threads per rank
  std::vector<StepScalars> step_scalars_;  // per group, reused
  std::vector<double> norm_scratch_;       // block sums of the norm (parallel_sum_squares or the optimizer pass)
  std::shared_ptr<device::DeviceContext> device_context_;        // a device engine's
  std::unique_ptr<DevicePass> device_pass_;                      // the norm and the update on the device
  OffloadPipeline* offload_ = nullptr;                           // ZeRO-Offload's
  std::vector<std::pair<void*, size_t>> device_grads_to_clear_;  // stage 1's, once their copies are done
  LossScaler scaler_;
  int64_t steps_ = 0;          // optimizer steps taken (skipped ones excluded)
  int consecutive_skips_ = 0;  // skipped steps in a row that count toward giving up (account())
};

}  // namespace zero
