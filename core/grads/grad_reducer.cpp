#include "grads/grad_reducer.hpp"

#include <algorithm>

#include "memory/ops.hpp"
#include "util/error.hpp"
#include "util/test_hooks.hpp"

namespace zero {
namespace {

std::string unit_name(int unit) { return "unit " + std::to_string(unit); }

}  // namespace

GradientReducer::~GradientReducer() {
  // A backend may still write into a bucket: after a collective was given up, or while reductions are in flight
  // (an engine destroyed in the middle of a micro-step; their Pendings, destroyed after this, mark them abandoned).
  // Host-staged, the backend writes the staging's copies, never a bucket.
  if (comm_.abandoned_requests() || (!in_flight_.empty() && !comm_.host_staged())) bucket_pool_.leak();
  drop_offloaded();
}

// ZeRO-Offload's copies still reading buckets end before the buckets may be freed or rewritten; their blocks are not
// added (an error or a new window came first).
void GradientReducer::drop_offloaded() {
  if (offload_ == nullptr) return;
  try {
    offload_->drop_gradients();
  } catch (const Error&) {  // a copy that stalled: the buckets are leaked with it
    bucket_pool_.leak();
  }
}

void GradientReducer::allocate(int num_params) {
  const Plan& plan = store_.plan();
  const Layout& layout = store_.layout();
  overlap_ = config_.overlap_comm && plan.bucketed();
  accumulators_.clear();
  accumulators_.reserve(static_cast<size_t>(store_.num_units()));  // the buckets point into it: never reallocated
  for (int u = 0; u < store_.num_units(); ++u) {
    accumulators_.emplace_back(store_.grads(u), store_.unit(u).norm_segments, store_.unit_plan(u).norm_begin,
                               store_.norm_plan().in_reduction(u), config_.comm_dtype);
    accumulators_.back().set_offload(offload_, u);
  }
  buckets_.clear();
  for (size_t b = 0; b < plan.buckets.size(); ++b) {
    const BucketLayout& g = plan.buckets[b];
    std::vector<Bucket::UnitSlot> slots;
    size_t params = 0;
    for (size_t i = 0; i < g.units.size(); ++i) {
      const int u = g.units[i];
      slots.push_back({u, g.unit_offsets[i], layout.units[u].padded_elems, layout.units[u].shard_elems,
                       &accumulators_[static_cast<size_t>(u)]});
      params += layout.units[u].params.size();
    }
    buckets_.emplace_back(static_cast<int>(b), g.elems, std::move(slots), config_.grad_accum_dtype, config_.comm_dtype);
    buckets_.back().expect(params);
  }
  if (plan.bucket.extent != Extent::kNone) {
    std::shared_ptr<Allocator> allocator = store_.allocators().get(plan.bucket.space, "a gradient bucket");
    // Buckets the peers read in place (comm/shared_arena.hpp), unless the framework gave its own host allocator.
    if (plan.bucket.space == MemorySpace::kHost && allocator.get() == &host_allocator())
      if (std::shared_ptr<Allocator> shared = comm_.backend().shared_allocator()) allocator = std::move(shared);
    bucket_pool_.set_capacity(plan.bucket.space, plan.bucket.elems, plan.bucket.dtype, std::move(allocator));
    bucket_pool_.reserve(1);
  }
  param_ready_.assign(static_cast<size_t>(num_params), 0);
  param_touched_.assign(static_cast<size_t>(num_params), 0);
  param_expected_.assign(static_cast<size_t>(num_params), 1);
  block_scratch_.assign(store_.norm_plan().most_folded_blocks(), 0.0);
}

void GradientReducer::clear() {
  drop_offloaded();
  in_flight_.clear();
  buckets_.clear();
  accumulators_.clear();
  bucket_pool_.clear();
}

bool GradientReducer::micro_step_begun() const {
  if (!in_flight_.empty()) return true;
  for (char c : param_touched_)
    if (c) return true;
  for (char c : param_ready_)
    if (c) return true;
  return false;
}

int GradientReducer::bucket_of_param(int param) const {
  return store_.plan().bucket_of_unit[store_.layout().params[param].unit];
}

void* GradientReducer::grad_buffer(int param, const std::string& param_name) {
  if (param_ready_[param])
    guard_.fail(ZERO_ERR_INVALID_STATE,
                "the gradient of '" + param_name + "' was already declared ready in this micro-step");
  param_touched_[param] = 1;
  const ParamPlacement& pl = store_.layout().params[param];
  if (!store_.plan().bucketed()) return store_.grads(pl.unit).at(pl.offset);
  // A bucket already reduced in this micro-step (its param was unused last time) gets a fresh buffer, which
  // zero_backward_end reduces again.
  Bucket& bucket = buckets_[bucket_of_param(param)];
  if (!bucket.collecting()) bucket_pool_.reserve(1);  // a local call: allocating here cannot leave another rank waiting
  const auto slot = std::find_if(bucket.units().begin(), bucket.units().end(),
                                 [&](const Bucket::UnitSlot& s) { return s.unit == pl.unit; });
  return bucket.gradients(bucket_pool_, *slot, pl.offset);
}

void GradientReducer::grad_ready(int param) {
  param_ready_[param] = 1;
  param_touched_[param] = 1;
  if (!store_.plan().bucketed() || !param_expected_[param]) return;  // an unexpected param waits for backward_end
  buckets_[bucket_of_param(param)].param_ready();
  reduce_ready_buckets();
}

// Buckets are reduced strictly in bucket order, so every rank issues the same sequence of collectives even if
// their backward passes declare gradients ready in a different order.
void GradientReducer::reduce_ready_buckets() {
  while (next_bucket_ < static_cast<int>(buckets_.size())) {
    const BucketTurn turn = turn_in_backward(buckets_[next_bucket_].count());
    if (turn == BucketTurn::kWait) return;
    if (turn == BucketTurn::kReduce) reduce_bucket(next_bucket_, false);
    next_bucket_ += 1;
  }
}

void GradientReducer::reduce_remaining() {
  if (!store_.plan().bucketed()) return;
  for (; next_bucket_ < static_cast<int>(buckets_.size()); ++next_bucket_)
    if (turn_at_backward_end(buckets_[next_bucket_].count()) == BucketTurn::kReduce) reduce_bucket(next_bucket_, false);
  finish_in_flight();
}

void GradientReducer::finish_oldest() {
  Bucket& bucket = buckets_[in_flight_.front()];
  guard_.moving_data([&] { bucket.finish(comm_, bucket_pool_, window_.running_last()); });
  in_flight_.pop_front();
}

void GradientReducer::finish_in_flight() {
  while (!in_flight_.empty()) finish_oldest();
}

// One agreement per bucket: which call triggers a bucket's reduction may differ between ranks (zero_grad_ready on
// one, zero_backward_end on another), the bucket may not. A second reduction of a bucket in one micro-step is a
// different call: the agreement tells them apart.
void GradientReducer::reduce_bucket(int index, bool again) {
  Bucket& bucket = buckets_[index];
  CollectiveCall call(guard_, CallKind::kReduceBucket);
  call.check([&] {
    test_hooks::maybe_fail("bucket", comm_.rank());
    try {
      if (!bucket.collecting()) bucket_pool_.reserve(1);  // no gradient was asked for: this rank contributes zeros
    } catch (const std::bad_alloc&) {
      guard_.fail(ZERO_ERR_OUT_OF_MEMORY, "out of memory for gradient bucket " + std::to_string(index));
    }
  });
  call.agree(again ? -(index + 1) : index, static_cast<int64_t>(bucket.elems()));
  call.move([&] {
    bucket.start(comm_, bucket_pool_, guard_.label("reduce-scatter of bucket " + std::to_string(index)),
                 window_.running_last());
    in_flight_.push_back(index);
    test_hooks::maybe_fail("bucket.group", comm_.rank());  // a failure while the group is in flight
  });
  // Without overlap the bucket completes now; with it, only when too many are in flight.
  while (in_flight_.size() > (overlap_ ? kMaxInFlight : 0)) finish_oldest();
}

// Stages 0-1, in zero_step: the full gradient of a unit, reduced in the communication dtype and back. The reduced
// values land in this rank's block, where the optimizer reads them (reduce-scatter), or everywhere (all-reduce).
void GradientReducer::reduce_full_grads(int unit) {
  const GradientView g = store_.grads(unit);
  const UnitPlan& up = store_.unit_plan(unit);
  const DType accum = config_.grad_accum_dtype, comm_type = config_.comm_dtype;
  const size_t full = store_.layout().units[unit].padded_elems, shard = store_.layout().units[unit].shard_elems;
  element_ops(g.space).convert(g.data, comm_type, g.data, accum, full);
  UnitAccumulator& acc = accumulators_[static_cast<size_t>(unit)];
  if (store_.plan().reduction == GradReduction::kAllReduceInStep) {
    comm_.all_reduce_sum(g.data, full, elem_type(comm_type), guard_.label("all-reduce of " + unit_name(unit)));
    if (comm_type != accum) acc.widen(0, full, block_scratch_);
  } else {
    comm_.reduce_scatter_sum(g.data, shard, elem_type(comm_type), guard_.label("reduce-scatter of " + unit_name(unit)));
    // The rank's block sits at update_begin in the communication dtype; widen it into the accumulation dtype's
    // place for the same elements (at the same byte or after it: convert() widens back to front).
    if (comm_type != accum) acc.widen(up.update_begin, shard, block_scratch_);
  }
}

void GradientReducer::reduce_in_step() {
  if (store_.plan().bucketed()) return;  // reduced bucket by bucket during backward
  for (int u = 0; u < store_.num_units(); ++u)
    if (store_.layout().units[u].padded_elems > 0) reduce_full_grads(u);  // frozen params only: no gradients
}

// zero_backward_end's second half: buckets that hold gradients no reduction covered — written after their bucket
// was reduced, or into a bucket that expected nothing — on any rank. The ranks exchange which buckets those are, and
// which params had a gradient (what each bucket expects in the next micro-step), in one all-gather of two bitmaps;
// every rank then reduces the same buckets, contributing zeros where it has nothing.
void GradientReducer::finish_micro_step() {
  if (store_.plan().bucketed()) {
    guard_.moving_data([&] {
      std::vector<char> holding(buckets_.size(), 0);
      for (size_t b = 0; b < buckets_.size(); ++b) holding[b] = buckets_[b].collecting();
      const std::vector<uint64_t> mine = micro_step_bits(param_touched_, holding);
      std::vector<uint64_t> all(mine.size() * static_cast<size_t>(comm_.size()), 0);
      std::copy(mine.begin(), mine.end(), all.begin() + static_cast<std::ptrdiff_t>(mine.size() * comm_.rank()));
      comm_.control_all_gather(all.data(), mine.size() * sizeof(uint64_t),
                               guard_.label("which params had gradients, which buckets hold unreduced ones"));
      std::vector<int> bucket_of(param_touched_.size());
      for (size_t p = 0; p < bucket_of.size(); ++p) bucket_of[p] = bucket_of_param(static_cast<int>(p));
      const MicroStepOutcome outcome =
          after_micro_step(all, comm_.size(), param_touched_.size(), bucket_of, buckets_.size());
      for (int b : outcome.reduce_again) reduce_bucket(b, true);
      param_expected_ = outcome.param_expected;
      for (size_t b = 0; b < buckets_.size(); ++b) buckets_[b].expect(outcome.bucket_expected[b]);
      finish_in_flight();  // every gradient is in its accumulator before zero_backward_end returns
      if (offload_ != nullptr) offload_->finish_gradients();
    });
    for (Bucket& bucket : buckets_) bucket.restart_micro_step();
    next_bucket_ = 0;
    bucket_pool_.trim(1);  // what a micro-step held beyond one bucket goes back (the first one can hold more)
  }
  std::fill(param_ready_.begin(), param_ready_.end(), 0);
  std::fill(param_touched_.begin(), param_touched_.end(), 0);
}

void GradientReducer::before_update() {
  if (!store_.plan().bucketed()) return;
  for (int u = 0; u < store_.num_units(); ++u)
    if (!accumulators_[static_cast<size_t>(u)].written()) {
      const GradientView g = store_.grads(u);
      fill_zero(g.space, g.data, g.elems * dtype_size(g.dtype));
    }
}

void GradientReducer::clear_all() {
  for (int u = 0; u < store_.num_units(); ++u) {
    const GradientView g = store_.grads(u);
    fill_zero(g.space, g.data, g.elems * dtype_size(g.dtype));
  }
}

void GradientReducer::after_step(bool skipped) {
  if (skipped) {
    clear_all();
  } else if (clear_in_update()) {
    // The pass zeroed what it read; the elements between params were never written, so they are still zero.
    for (int u = 0; u < store_.num_units(); ++u) {
      const GradientView g = store_.grads(u);
      const UnitPlan& up = store_.unit_plan(u);
      const size_t begin = up.update_in_grads, end = begin + up.update_elems, esize = dtype_size(g.dtype);
      fill_zero(g.space, g.data, begin * esize);
      fill_zero(g.space, g.at(end), (g.elems - end) * esize);
    }
  }
  for (UnitAccumulator& acc : accumulators_) acc.start_window();
}

void GradientReducer::after_load() {
  drop_offloaded();
  clear_all();
  for (UnitAccumulator& acc : accumulators_) acc.start_window();
}

}  // namespace zero
