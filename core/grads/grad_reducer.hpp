// The gradient reducer: where the framework's gradients go, how they are summed over ranks (Plan::reduction), and
// their life from one window to the next. With buckets (stages 2-3, grads/bucket.hpp) it gives out the bucket
// buffers during backward and reduces each bucket when it is complete (grads/bucket_readiness.hpp); in zero_step it
// reduces the full gradient buffers of the stages that keep them (0-1). Every reduction it starts is a CollectiveCall.
// It is also the one part that clears gradients: the optimizer pass clears what it reads where the next window adds
// into the buffers (stages 0-1, clear_in_update()), and the rest is cleared here (after_step).
#pragma once

#include <deque>
#include <string>
#include <vector>

#include "comm/call_guard.hpp"
#include "comm/engine_comm.hpp"
#include "config/config.hpp"
#include "grads/accumulator.hpp"
#include "grads/bucket.hpp"
#include "memory/pool.hpp"
#include "params/param_store.hpp"
#include "plan/micro_step_window.hpp"

namespace zero {

class GradientReducer {
 public:
  GradientReducer(const Config& config, EngineComm& comm, CallGuard& guard, ParameterStore& store,
                  const MicroStepWindow& window)
      : config_(config), comm_(comm), guard_(guard), store_(store), window_(window) {}
  ~GradientReducer();

  // finalize: the accumulators, the buckets and the bucket buffer of the plan. Local; throws on allocation failure.
  // ZeRO-Offload's pipeline, which brings a device's reduced shards to their host accumulators (before allocate;
  // null without).
  void set_offload(OffloadPipeline* offload) { offload_ = offload; }
  void allocate(int num_params);
  void clear();

  // zero_grad_data: where the framework adds the gradient of `param` in this micro-step.
  void* grad_buffer(int param, const std::string& param_name);
  bool declared_ready(int param) const { return param_ready_[static_cast<size_t>(param)] != 0; }
  // A gradient was asked for or declared ready since the last zero_backward_end (bucket buffers or reductions may
  // be in flight): no checkpoint now.
  bool micro_step_begun() const;
  // zero_grad_ready: reduces every bucket that is complete, in bucket order (collective when one is).
  void grad_ready(int param);
  // zero_backward_end, before its agreement: the buckets not reduced yet that expect gradients, and those in flight.
  void reduce_remaining();
  // zero_backward_end, after its agreement: gradients no reduction covered, on any rank (collective); then the
  // state of the next micro-step.
  void finish_micro_step();
  // zero_step: the reductions the plan leaves to the step (full gradient buffers: stages 0-1). Collective.
  void reduce_in_step();

  // ---- the gradients' life over a window
  // zero_step, before the update reads the accumulators: those no reduction wrote in this window (every param of
  // the unit unused on every rank) are zeroed, since the window's first reduction writes instead of adding.
  void before_update();
  // Whether the optimizer pass zeroes the gradients it reads (the next window adds into them: stages 0-1).
  bool clear_in_update() const { return !store_.plan().bucketed(); }
  // After the update (or a skipped step): what the pass did not clear — all of it when the step was skipped, the
  // other ranks' blocks at stage 1 (left in the communication dtype by the reduce-scatter) — and a new window.
  void after_step(bool skipped);
  // A checkpoint's load: every gradient cleared, a new window.
  void after_load();

  // The norm's per-segment sums of unit u, summed as its final reduced values were written (UnitAccumulator), or
  // null where they were not (the stepper reads the gradients).
  const double* folded_squares(int unit) const { return accumulators_[static_cast<size_t>(unit)].folded_squares(); }

  // The buckets allocated now (what zero_memory_stats reports beyond the plan's one).
  size_t buckets_held() const { return bucket_pool_.buffers(); }
  uint64_t bucket_bytes() const { return bucket_pool_.allocated_bytes(); }

 private:
  void drop_offloaded();
  // With overlap_comm, a bucket's reduce-scatters are started at its last zero_grad_ready and completed later —
  // when more than kMaxInFlight buckets are in flight, the oldest; the rest at zero_backward_end — so that the
  // framework's backward goes on meanwhile. The buckets hold different units, so the order of completion changes
  // no sum.
  static constexpr size_t kMaxInFlight = 2;

  void reduce_ready_buckets();
  void reduce_bucket(int bucket, bool again);
  void finish_oldest();
  void finish_in_flight();
  void reduce_full_grads(int unit);
  void clear_all();
  int bucket_of_param(int param) const;

  const Config& config_;
  EngineComm& comm_;
  CallGuard& guard_;
  ParameterStore& store_;
  const MicroStepWindow& window_;
  std::vector<UnitAccumulator> accumulators_;  // per unit
  std::vector<Bucket> buckets_;
  BufferPool bucket_pool_;
  OffloadPipeline* offload_ = nullptr;
  bool overlap_ = false;
  std::deque<int> in_flight_;          // buckets whose reduction is in flight, oldest first
  int next_bucket_ = 0;                // the first bucket not reduced yet in this micro-step
  std::vector<char> param_ready_;      // per param, this micro-step
  std::vector<char> param_touched_;    // per param: zero_grad_data was called in this micro-step
  std::vector<char> param_expected_;   // per param: its bucket waits for it (grads/bucket_readiness.hpp)
  std::vector<double> block_scratch_;  // UnitAccumulator::widen's block sums
};

}  // namespace zero
