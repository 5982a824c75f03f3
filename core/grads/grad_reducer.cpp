#include "grads/grad_reducer.hpp"

#include <algorithm>

#include "kernels/kernels.hpp"
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
  if (comm_.abandoned_requests() || !in_flight_.empty()) bucket_pool_.leak();
}

void GradientReducer::allocate(int num_params) {
  const Plan& plan = store_.plan();
  overlap_ = config_.overlap_comm && plan.bucketed();
  buckets_.assign(plan.buckets.size(), BucketState{});
  for (size_t b = 0; b < plan.buckets.size(); ++b)
    for (int u : plan.buckets[b].units) buckets_[b].params_expected += store_.layout().units[u].params.size();
  if (plan.bucket.extent != Extent::kNone) {
    bucket_pool_.set_capacity(plan.bucket.space, plan.bucket.elems, plan.bucket.dtype,
                              store_.allocators().get(plan.bucket.space, "a gradient bucket"));
    bucket_pool_.reserve(1);
  }
  param_ready_.assign(static_cast<size_t>(num_params), 0);
  param_touched_.assign(static_cast<size_t>(num_params), 0);
  param_expected_.assign(static_cast<size_t>(num_params), 1);
  written_.assign(static_cast<size_t>(store_.num_units()), 0);
  // Folding pays where zero_step would otherwise read the norm's shard in a pass of its own: where the norm is
  // needed before the update (clipping, or the skip), or where the optimizer pass cannot sum it (a rank that updates
  // more than its norm shard: stage 0 at N > 1). And only where a pass of the engine writes the reduced values: the
  // bucket accumulation (stages 2-3), or the widening from a narrower communication dtype (stages 0-1; otherwise
  // the backend writes them and nothing else touches them).
  const bool widened = dtype_size(config_.comm_dtype) < dtype_size(config_.grad_accum_dtype);
  const bool norm_first = config_.skip_nonfinite_steps || config_.gradient_clipping > 0.0;
  const size_t units = static_cast<size_t>(store_.num_units());
  foldable_.assign(units, 0);
  segment_squares_.assign(units, {});
  squares_final_.assign(units, 0);
  size_t most_blocks = 0;
  for (int u = 0; (plan.bucketed() || widened) && u < store_.num_units(); ++u) {
    ParameterStore::UnitBuffers& ub = store_.unit(u);
    const UnitPlan& up = store_.unit_plan(u);
    const size_t shard = store_.layout().units[u].shard_elems, full = store_.layout().units[u].padded_elems;
    bool ascending = true;
    size_t end = 0;
    for (const ShardSegment& s : ub.norm_segments) {
      ascending = ascending && s.shard_offset >= end;
      end = s.shard_offset + s.numel;
    }
    const bool pass_sums_norm =
        up.update_begin == up.norm_begin && up.update_in_grads == up.norm_in_grads && up.update_elems == shard;
    bool writes_norm_range;
    if (plan.bucketed()) {  // the accumulator is the shard the norm reads
      writes_norm_range = store_.norm_grads(u) == ub.grads.data();
    } else {  // widened: everything (all-reduce) or the rank's block (reduce-scatter), into the place it is read
      const size_t begin = plan.reduction == GradReduction::kAllReduceInStep ? 0 : up.update_begin;
      const size_t length = plan.reduction == GradReduction::kAllReduceInStep ? full : shard;
      writes_norm_range = store_.norm_grads(u) == ub.grads.at(up.norm_begin) && begin <= up.norm_begin &&
                          up.norm_begin + shard <= begin + length;
    }
    foldable_[u] = ascending && writes_norm_range && (norm_first || !pass_sums_norm);
    if (!foldable_[u]) continue;
    segment_squares_[u].assign(ub.norm_segments.size(), 0.0);
    size_t blocks = 0;
    for (const ShardSegment& s : ub.norm_segments) blocks += sum_squares_blocks(s.numel);
    most_blocks = std::max(most_blocks, blocks);
  }
  block_squares_.assign(most_blocks, 0.0);
}

void GradientReducer::start_window() {
  std::fill(written_.begin(), written_.end(), 0);
  std::fill(squares_final_.begin(), squares_final_.end(), 0);
}

const double* GradientReducer::folded_squares(int unit) const {
  return squares_final_[unit] ? segment_squares_[unit].data() : nullptr;
}

// The shard is walked in the order of its norm segments (params, ascending offsets): the gaps between them
// (alignment, padding) are accumulated only, each segment block by block (kSumBlockElems from its start, the norm
// pass's blocks) and each block's squares summed right after it is written, from cache. The accumulation itself is
// element-wise, so cutting it into pieces changes no bit.
void GradientReducer::accumulate_into_unit(int unit, const char* reduced) {
  // The window's first reduction of a unit writes its accumulator, which the optimizer pass left as it was (nothing
  // to clear there); later ones add.
  const DType accum = config_.grad_accum_dtype, comm_type = config_.comm_dtype;
  ParameterStore::UnitBuffers& ub = store_.unit(unit);
  const ElementOps& ops = element_ops(ub.grads.space());
  const auto add = written_[unit] ? ops.accumulate : ops.accumulate_into_zero;
  const size_t shard = store_.layout().units[unit].shard_elems;
  char* acc = static_cast<char*>(ub.grads.data());
  written_[unit] = 1;
  squares_final_[unit] = 0;
  if (!foldable_[unit] || micro_step_in_window_ != config_.gradient_accumulation_steps - 1)
    return add(acc, accum, reduced, comm_type, shard);
  const size_t acc_size = dtype_size(accum), red_size = dtype_size(comm_type);
  auto run = [&](size_t begin, size_t end) {
    if (end > begin) add(acc + begin * acc_size, accum, reduced + begin * red_size, comm_type, end - begin);
  };
  const SumSquaresKernel squares = kernels(ub.grads.space(), active_isa()).sum_squares[static_cast<int>(accum)];
  std::vector<double>& sums = segment_squares_[unit];
  size_t pos = 0;
  for (size_t i = 0; i < ub.norm_segments.size(); ++i) {
    const ShardSegment& s = ub.norm_segments[i];
    run(pos, s.shard_offset);
    double sum = 0.0;  // block order from zero, as parallel_sum_squares adds them
    for (size_t begin = 0; begin < s.numel; begin += kSumBlockElems) {
      const size_t n = std::min(kSumBlockElems, s.numel - begin), at = s.shard_offset + begin;
      run(at, at + n);
      sum += squares(acc + at * acc_size, n);
    }
    sums[i] = sum;
    pos = s.shard_offset + s.numel;
  }
  run(pos, shard);
  squares_final_[unit] = 1;
}

bool GradientReducer::micro_step_begun() const {
  if (!in_flight_.empty()) return true;
  for (char c : param_touched_)
    if (c) return true;
  for (char c : param_ready_)
    if (c) return true;
  return false;
}

void GradientReducer::zero_unwritten_accumulators() {
  if (!accumulators_written_on_reduction()) return;
  for (int u = 0; u < store_.num_units(); ++u)
    if (!written_[u]) store_.unit(u).grads.zero();
}

void GradientReducer::clear() {
  in_flight_.clear();
  buckets_.clear();
  bucket_pool_.clear();
}

int GradientReducer::bucket_of_param(int param) const {
  return store_.plan().bucket_of_unit[store_.layout().params[param].unit];
}

void* GradientReducer::grad_buffer(int param, const std::string& param_name) {
  if (param_ready_[param])
    fail(ZERO_ERR_INVALID_STATE,
         "zero_grad_data: the gradient of '" + param_name + "' was already declared ready in this micro-step");
  param_touched_[param] = 1;
  const ParamPlacement& pl = store_.layout().params[param];
  if (!store_.plan().bucketed()) return store_.unit(pl.unit).grads.at(pl.offset);
  // A bucket already reduced in this micro-step (its param was unused last time) gets a fresh buffer, which
  // zero_backward_end reduces again.
  const int b = bucket_of_param(param);
  BucketState& bs = buckets_[b];
  if (bs.buffer == nullptr) {
    bucket_pool_.reserve(1);  // a local call: allocating here cannot leave another rank waiting
    bs.buffer = bucket_pool_.acquire();
    fill_zero(bucket_pool_.space(), bs.buffer, store_.plan().buckets[b].elems * grad_size());
  }
  return static_cast<char*>(bs.buffer) + (store_.plan().offset_in_bucket[pl.unit] + pl.offset) * grad_size();
}

void GradientReducer::grad_ready(int param, const char* call) {
  param_ready_[param] = 1;
  param_touched_[param] = 1;
  if (!store_.plan().bucketed() || !param_expected_[param]) return;  // an unexpected param waits for backward_end
  buckets_[bucket_of_param(param)].params_ready += 1;
  reduce_ready_buckets(call);
}

// Buckets are reduced strictly in bucket order, so every rank issues the same sequence of collectives even if
// their backward passes declare gradients ready in a different order.
void GradientReducer::reduce_ready_buckets(const char* call) {
  while (next_bucket_to_reduce_ < static_cast<int>(buckets_.size())) {
    BucketState& bs = buckets_[next_bucket_to_reduce_];
    if (bs.params_ready != bs.params_expected) return;
    // A bucket that expects nothing (every param of it unused last time) is not reduced in order: if some rank
    // wrote gradients into it after all, zero_backward_end reduces it.
    if (bs.params_expected > 0) reduce_bucket(next_bucket_to_reduce_, false, call);
    next_bucket_to_reduce_ += 1;
  }
}

void GradientReducer::reduce_remaining(const char* call) {
  if (!store_.plan().bucketed()) return;
  while (next_bucket_to_reduce_ < static_cast<int>(buckets_.size())) {
    if (buckets_[next_bucket_to_reduce_].params_expected > 0) reduce_bucket(next_bucket_to_reduce_, false, call);
    next_bucket_to_reduce_ += 1;
  }
  complete_in_flight();
}

// Widening in place runs back to front (a wider element overwrites the narrower ones after it), so the range is
// cut into pieces — the gaps around the norm's segments, each segment's blocks — converted last piece first; each
// block's squares are summed right after it is widened, from cache, and the blocks' sums added front to back.
void GradientReducer::widen_in_unit(int unit, size_t begin, size_t n) {
  const DType accum = config_.grad_accum_dtype, comm_type = config_.comm_dtype;
  ParameterStore::UnitBuffers& ub = store_.unit(unit);
  const ElementOps& ops = element_ops(ub.grads.space());
  char* g = static_cast<char*>(ub.grads.data());
  const size_t acc_size = dtype_size(accum), red_size = dtype_size(comm_type);
  // Elements [a, b) of the unit: from the reduced buffer's layout (element e at byte e x the communication dtype's
  // size) into the accumulation dtype's (at byte e x its size: the same byte or after, never before).
  auto widen = [&](size_t a, size_t b) {
    if (b > a) ops.convert(g + a * acc_size, accum, g + a * red_size, comm_type, b - a);
  };
  squares_final_[unit] = 0;
  if (!foldable_[unit]) return widen(begin, begin + n);
  const UnitPlan& up = store_.unit_plan(unit);
  const SumSquaresKernel squares = kernels(ub.grads.space(), active_isa()).sum_squares[static_cast<int>(accum)];
  const std::vector<ShardSegment>& segments = ub.norm_segments;
  size_t first_block = 0;
  for (const ShardSegment& s : segments) first_block += sum_squares_blocks(s.numel);
  size_t end = begin + n;  // what is still narrow: [begin, end)
  for (size_t i = segments.size(); i-- > 0;) {
    const ShardSegment& s = segments[i];
    const size_t from = up.norm_begin + s.shard_offset, blocks = sum_squares_blocks(s.numel);
    first_block -= blocks;
    widen(from + s.numel, end);
    for (size_t b = blocks; b-- > 0;) {
      const size_t a = from + b * kSumBlockElems, len = std::min(kSumBlockElems, s.numel - b * kSumBlockElems);
      widen(a, a + len);
      block_squares_[first_block + b] = squares(g + a * acc_size, len);
    }
    end = from;
  }
  widen(begin, end);
  size_t at = 0;
  for (size_t i = 0; i < segments.size(); ++i) {
    double sum = 0.0;  // block order from zero, as parallel_sum_squares adds them
    for (size_t b = 0; b < sum_squares_blocks(segments[i].numel); ++b) sum += block_squares_[at++];
    segment_squares_[unit][i] = sum;
  }
  squares_final_[unit] = 1;
}

void GradientReducer::complete_oldest() {
  InFlight& f = in_flight_.front();
  guard_.moving_data([&] {
    comm_.wait_all(f.pending);
    const Bucket& b = store_.plan().buckets[f.bucket];
    const int rank = comm_.rank();
    for (size_t i = 0; i < b.units.size(); ++i) {
      const int u = b.units[i];
      const size_t shard = store_.layout().units[u].shard_elems;
      const char* full = static_cast<const char*>(f.buffer) + b.unit_offsets[i] * grad_size();
      accumulate_into_unit(u, full + rank * shard * dtype_size(config_.comm_dtype));
    }
    bucket_pool_.give_back(f.buffer);
  });
  in_flight_.pop_front();
}

void GradientReducer::complete_in_flight() {
  while (!in_flight_.empty()) complete_oldest();
}

// The units of a bucket: each narrowed in place to the communication dtype, all reduce-scattered as one group
// (started together, so a backend can overlap or fuse them), and this rank's block of each added into its shard
// accumulator. One agreement per bucket: which call triggers a bucket's reduction may differ between ranks
// (zero_grad_ready on one, zero_backward_end on another), the bucket may not.
void GradientReducer::reduce_bucket(int bucket, bool again, const char* call) {
  BucketState& bs = buckets_[bucket];
  const Bucket& b = store_.plan().buckets[bucket];
  std::unique_ptr<Error> local;
  try {
    test_hooks::maybe_fail("bucket", comm_.rank());
    if (bs.buffer == nullptr) bucket_pool_.reserve(1);  // no gradient was asked for: this rank contributes zeros
  } catch (const Error& e) {
    local = std::make_unique<Error>(e);
  } catch (const std::bad_alloc&) {
    local = std::make_unique<Error>(
        ZERO_ERR_OUT_OF_MEMORY, std::string(call) + ": out of memory for gradient bucket " + std::to_string(bucket));
  }
  // A second reduction of a bucket in one micro-step is a different call: the agreement tells them apart.
  guard_.agree(call, CallTag{CallKind::kReduceBucket, again ? -(bucket + 1) : bucket, static_cast<int64_t>(b.elems), 0},
               local.get());
  guard_.moving_data([&] {
    if (bs.buffer == nullptr) {
      bs.buffer = bucket_pool_.acquire();
      fill_zero(bucket_pool_.space(), bs.buffer, b.elems * grad_size());
    }
    const DType accum = config_.grad_accum_dtype, comm_type = config_.comm_dtype;
    const ElementOps& ops = element_ops(bucket_pool_.space());
    std::vector<EngineComm::Planned> group;
    for (size_t i = 0; i < b.units.size(); ++i) {
      const int u = b.units[i];
      char* full = static_cast<char*>(bs.buffer) + b.unit_offsets[i] * grad_size();
      ops.convert(full, comm_type, full, accum, store_.layout().units[u].padded_elems);
      group.push_back(
          {CollKind::kReduceScatter, full, store_.layout().units[u].shard_elems, elem_type(comm_type),
           std::string(call) + ": reduce-scatter of bucket " + std::to_string(bucket) + ", " + unit_name(u)});
    }
    InFlight f;
    f.bucket = bucket;
    f.buffer = bs.buffer;
    f.pending = comm_.start_group(std::move(group));
    bs.buffer = nullptr;  // a gradient that comes later gets a fresh buffer (reduced again at zero_backward_end)
    in_flight_.push_back(std::move(f));
    test_hooks::maybe_fail("bucket.group", comm_.rank());  // a failure while the group is in flight
  });
  // Without overlap the bucket completes now; with it, only when too many are in flight.
  while (in_flight_.size() > (overlap_ ? kMaxInFlight : 0)) complete_oldest();
}

// Stages 0-1, in zero_step: the full gradient of a unit, reduced in the communication dtype and back. The reduced
// values land in this rank's block, where the optimizer reads them (reduce-scatter), or everywhere (all-reduce).
void GradientReducer::reduce_full_grads(int unit) {
  ParameterStore::UnitBuffers& ub = store_.unit(unit);
  const UnitPlan& up = store_.unit_plan(unit);
  const ElementOps& ops = element_ops(ub.grads.space());
  const DType accum = config_.grad_accum_dtype, comm_type = config_.comm_dtype;
  const size_t full = store_.layout().units[unit].padded_elems, shard = store_.layout().units[unit].shard_elems;
  void* g = ub.grads.data();
  ops.convert(g, comm_type, g, accum, full);
  if (store_.plan().reduction == GradReduction::kAllReduceInStep) {
    comm_.all_reduce_sum(g, full, elem_type(comm_type), "zero_step: all-reduce of " + unit_name(unit));
    if (comm_type != accum) widen_in_unit(unit, 0, full);
  } else {
    comm_.reduce_scatter_sum(g, shard, elem_type(comm_type), "zero_step: reduce-scatter of " + unit_name(unit));
    // The rank's block sits at update_begin in the communication dtype; widen it into the accumulation dtype's
    // place for the same elements (at the same byte or after it: convert() widens back to front).
    if (comm_type != accum) widen_in_unit(unit, up.update_begin, shard);
  }
}

void GradientReducer::reduce_in_step() {
  if (store_.plan().bucketed()) return;  // reduced bucket by bucket during backward
  for (int u = 0; u < store_.num_units(); ++u) reduce_full_grads(u);
}

// zero_backward_end's second half: buckets that hold gradients no reduction covered — written after their bucket
// was reduced, or into a bucket that expected nothing — on any rank. The ranks exchange which buckets those are, and
// which params had a gradient (what each bucket expects in the next micro-step), in one all-gather of two bitmaps;
// every rank then reduces the same buckets, contributing zeros where it has nothing.
void GradientReducer::finish_micro_step(const char* call) {
  if (store_.plan().bucketed()) {
    guard_.moving_data([&] {
      reduce_pending_buckets(call);
      complete_in_flight();  // every gradient is in its accumulator before zero_backward_end returns
    });
    for (auto& bs : buckets_) bs.params_ready = 0;
    next_bucket_to_reduce_ = 0;
    bucket_pool_.trim(1);  // what a micro-step held beyond one bucket goes back (the first one can hold more)
  }
  std::fill(param_ready_.begin(), param_ready_.end(), 0);
  std::fill(param_touched_.begin(), param_touched_.end(), 0);
}

void GradientReducer::reduce_pending_buckets(const char* call) {
  const size_t n_params = param_touched_.size(), n_buckets = buckets_.size();
  const size_t words = (n_params + n_buckets + 63) / 64;
  std::vector<uint64_t> all(words * static_cast<size_t>(comm_.size()), 0);
  uint64_t* mine = all.data() + words * comm_.rank();
  for (size_t p = 0; p < n_params; ++p)
    if (param_touched_[p]) mine[p / 64] |= uint64_t{1} << (p % 64);
  for (size_t b = 0; b < n_buckets; ++b)
    if (buckets_[b].buffer != nullptr) mine[(n_params + b) / 64] |= uint64_t{1} << ((n_params + b) % 64);
  comm_.control_all_gather(all.data(), words * sizeof(uint64_t),
                           std::string(call) + ": which params had gradients, which buckets hold unreduced ones");
  std::vector<uint64_t> any(words, 0);
  for (int r = 0; r < comm_.size(); ++r)
    for (size_t w = 0; w < words; ++w) any[w] |= all[words * r + w];
  auto bit = [&](size_t i) { return (any[i / 64] >> (i % 64)) & 1u; };
  for (size_t b = 0; b < n_buckets; ++b)
    if (bit(n_params + b)) reduce_bucket(static_cast<int>(b), true, call);
  for (auto& bs : buckets_) bs.params_expected = 0;
  for (size_t p = 0; p < n_params; ++p) {
    param_expected_[p] = static_cast<char>(bit(p));
    if (param_expected_[p]) buckets_[bucket_of_param(static_cast<int>(p))].params_expected += 1;
  }
}

}  // namespace zero
