// The gradient reducer: where the framework's gradients go and how they are summed over ranks, as the plan says
// (Plan::reduction). With buckets (stages 2-3) it owns the bucket buffers and their state during backward; in
// zero_step it reduces the full gradient buffers of the stages that keep them (0-1). Every reduction it starts is
// a collective under the engine's CallGuard.
#pragma once

#include <deque>
#include <string>
#include <vector>

#include "comm/call_guard.hpp"
#include "comm/engine_comm.hpp"
#include "config/config.hpp"
#include "memory/pool.hpp"
#include "params/param_store.hpp"

namespace zero {

class GradientReducer {
 public:
  GradientReducer(const Config& config, EngineComm& comm, CallGuard& guard, ParameterStore& store)
      : config_(config), comm_(comm), guard_(guard), store_(store) {}
  ~GradientReducer();

  // finalize: per-param state and the bucket buffer of the plan. Local; throws on allocation failure.
  void allocate(int num_params);
  void clear();

  // zero_grad_data: where the framework adds the gradient of `param` in this micro-step.
  void* grad_buffer(int param, const std::string& param_name);
  bool declared_ready(int param) const { return param_ready_[param] != 0; }
  // A gradient was asked for or declared ready since the last zero_backward_end (bucket buffers or reductions may
  // be in flight): no checkpoint now.
  bool micro_step_begun() const;
  // zero_grad_ready: reduces every bucket that is complete, in bucket order (collective when one is).
  void grad_ready(int param, const char* call);
  // zero_backward_end, before its agreement: the buckets not reduced yet that expect gradients. Collective.
  void reduce_remaining(const char* call);
  // zero_backward_end, after its agreement: gradients no reduction covered, on any rank (collective); then the
  // state of the next micro-step.
  void finish_micro_step(const char* call);
  // zero_step: the reductions the plan leaves to the step (full gradient buffers: stages 0-1). Collective.
  void reduce_in_step();

  // overlap_comm: completes the bucket reductions still in flight (zero_backward_end, before its agreement).
  void complete_in_flight();

  // Bucketed plans: the shard accumulators are written, not added into, by the first reduction of an accumulation
  // window, so the optimizer pass need not clear them (4 bytes per element less in zero_step). zero_step, before
  // it reads them: zeroes those no reduction wrote in this window (every param of the unit unused on every rank).
  // After the step (or a checkpoint load): a new window.
  bool accumulators_written_on_reduction() const { return store_.plan().bucketed(); }
  void zero_unwritten_accumulators();
  void start_window();

  // When zero_step needs the norm before the update (clipping, or the skip of a non-finite step), the pass that
  // leaves the reduced values where the norm reads them also sums their squares, block by block while the block is
  // still in cache, so that zero_step need not read the shard again: at stages 2-3 the accumulation into the shard
  // accumulators in the window's last micro-step; at stages 0-1 the widening after a reduction in a narrower
  // communication dtype (bf16 training: reduced in bf16, accumulated in fp32). For unit u, the sums of its norm
  // segments (in Stepper::local_sum_squares's blocks, order and bits), or null where the unit's final values did
  // not come from such a pass (the stepper then reads them).
  const double* folded_squares(int unit) const;
  // Where the engine is in the accumulation window: the micro-steps completed since it began (the engine counts
  // them; the folding above happens in the micro-step numbered gradient_accumulation_steps - 1).
  void set_micro_step_in_window(int64_t completed) { micro_step_in_window_ = completed; }

  // The buckets allocated now (what zero_memory_stats reports beyond the plan's one).
  size_t buckets_held() const { return bucket_pool_.buffers(); }
  uint64_t bucket_bytes() const { return bucket_pool_.allocated_bytes(); }

 private:
  // A gradient bucket of the current micro-step. A bucket is reduced as soon as every param it expects is
  // declared ready; it expects the params that had a gradient (on any rank) in the previous micro-step — all of
  // them in the first one — so that an unused or frozen param does not hold its bucket, and every later one, back
  // until zero_backward_end. A gradient that arrives after its bucket was reduced (a param unused last time) goes
  // into a fresh buffer that zero_backward_end reduces again.
  struct BucketState {
    void* buffer = nullptr;      // from the bucket pool while it holds gradients not reduced yet
    size_t params_ready = 0;     // expected params declared ready
    size_t params_expected = 0;  // params the bucket waits for
  };

  // With overlap_comm, a bucket's reduce-scatters are started at its last zero_grad_ready and completed later —
  // when more than kMaxInFlight buckets are in flight, the oldest; the rest at zero_backward_end — so that the
  // framework's backward goes on meanwhile. Completing one adds its results into the shard accumulators; the
  // buckets hold different units, so the order of completion changes no sum.
  struct InFlight {
    int bucket = 0;
    void* buffer = nullptr;
    std::vector<EngineComm::Pending> pending;
  };
  static constexpr size_t kMaxInFlight = 2;
  void complete_oldest();

  void reduce_ready_buckets(const char* call);
  void reduce_bucket(int bucket, bool again, const char* call);
  void reduce_pending_buckets(const char* call);
  void reduce_full_grads(int unit);
  // Adds (or, first in the window, writes) a reduced block into unit u's accumulator; in the window's last
  // micro-step also sums the squares of the result (folded_squares).
  void accumulate_into_unit(int unit, const char* reduced);
  // Widens unit u's reduced elements [begin, begin + n) in place, from the communication dtype into the
  // accumulation dtype's place; where foldable, also sums the squares of the norm's part (folded_squares).
  void widen_in_unit(int unit, size_t begin, size_t n);
  int bucket_of_param(int param) const;
  size_t grad_size() const { return dtype_size(config_.grad_accum_dtype); }

  const Config& config_;
  EngineComm& comm_;
  CallGuard& guard_;
  ParameterStore& store_;
  std::vector<BucketState> buckets_;
  BufferPool bucket_pool_;
  bool overlap_ = false;
  std::deque<InFlight> in_flight_;
  int next_bucket_to_reduce_ = 0;
  std::vector<char> param_ready_;     // per param, this micro-step
  std::vector<char> param_touched_;   // per param: zero_grad_data was called in this micro-step
  std::vector<char> param_expected_;  // per param: its bucket waits for it (BucketState)
  std::vector<char> written_;         // per unit: a reduction wrote its accumulator in this accumulation window
  int64_t micro_step_in_window_ = 0;  // set_micro_step_in_window
  // allocate(): per unit, whether its reductions can sum the norm's squares (the step needs the norm before the
  // update; bucketed, or a communication dtype narrower than the accumulation dtype; the pass writes what the norm
  // reads; the norm segments in ascending order).
  std::vector<char> foldable_;
  std::vector<double> block_squares_;  // widen_in_unit: the blocks' sums, widened back to front, added front to back
  std::vector<std::vector<double>> segment_squares_;  // per unit, per norm segment (folded_squares), sized once
  std::vector<char> squares_final_;  // per unit: segment_squares_ holds the sums of the accumulator's final values
};

}  // namespace zero
