// The micro-step: gathering and releasing units, gradient buffers and their reduction in buckets.
//
// Every collective here follows the engine's rule (engine.hpp): local checks and allocation, then the agreement
// (comm_.agree: every rank learns of a failure anywhere, and ranks about to run different collectives all get
// ZERO_ERR_MISMATCH), then the data; a failure while data moves breaks the engine.
#include <cstring>

#include "convert.hpp"
#include "engine.hpp"
#include "error.hpp"
#include "test_hooks.hpp"

namespace zero {
namespace {

std::string unit_name(int unit) { return "unit " + std::to_string(unit); }

}  // namespace

void Engine::check_window(const char* call) const {
  if (micro_steps_ == config_.gradient_accumulation_steps)
    fail(ZERO_ERR_INVALID_STATE, std::string(call) + ": gradient_accumulation_steps (" +
                                     std::to_string(config_.gradient_accumulation_steps) +
                                     ") micro-steps are complete; call zero_step first");
}

void* Engine::param_data(int param) {
  require_state(State::kReady, "zero_param_data");
  check_param(param, "zero_param_data");
  const ParamPlacement& pl = layout_.params[param];
  UnitState& us = units_[pl.unit];
  // The same rule at every stage, so that code written against a small model or a low stage keeps working when
  // units grow past the persistence threshold or the stage changes.
  if (us.gathered == nullptr)
    fail(ZERO_ERR_INVALID_STATE, "zero_param_data: param '" + param_name(param) + "' lives in " + unit_name(pl.unit) +
                                     ", which is not gathered; call zero_gather(engine, " + std::to_string(pl.unit) +
                                     ") first (at every stage: it is free below stage 3)");
  return static_cast<char*>(us.gathered) + pl.offset * compute_size();
}

void* Engine::grad_data(int param) {
  require_state(State::kReady, "zero_grad_data");
  check_param(param, "zero_grad_data");
  check_window("zero_grad_data");
  const ParamPlacement& pl = layout_.params[param];
  UnitState& us = units_[pl.unit];
  if (param_ready_[param])
    fail(ZERO_ERR_INVALID_STATE,
         "zero_grad_data: the gradient of '" + param_name(param) + "' was already declared ready in this micro-step");
  param_touched_[param] = 1;
  if (!bucketed_grads()) return us.grads.at(pl.offset);
  // A bucket already reduced in this micro-step (its param was unused last time) gets a fresh buffer, which
  // zero_backward_end reduces again.
  BucketState& bs = bucket_states_[us.bucket];
  if (bs.buffer == nullptr) {
    bucket_pool_.reserve(1);  // a local call: allocating here cannot leave another rank waiting
    bs.buffer = bucket_pool_.acquire();
    std::memset(bs.buffer, 0, buckets_[us.bucket].elems * grad_size());
  }
  return static_cast<char*>(bs.buffer) + (us.offset_in_bucket + pl.offset) * grad_size();
}

void Engine::gather(int unit) {
  const char* call = "zero_gather";
  // Resident units (and every unit below stage 3) are gathered locally. At stage 3 a call with a unit id this rank
  // does not know (or before finalize) is treated as the collective it was meant to be: its failure reaches the
  // others through the agreement.
  const bool known = state_ == State::kReady && unit >= 0 && unit < static_cast<int>(units_.size());
  if ((known && !sharded_params(unit)) || (!known && config_.stage != 3)) {
    require_state(State::kReady, call);
    check_unit(unit, call);
    UnitState& us = units_[unit];
    if (us.gathered != nullptr)
      fail(ZERO_ERR_INVALID_STATE, "zero_gather: " + unit_name(unit) + " is already gathered; release it first");
    us.gathered = us.params.data();
    us.generation += 1;
    return;
  }
  // Collective from here: every rank reaches the agreement, even one whose call is wrong.
  void* buffer = nullptr;
  std::unique_ptr<Error> local = local_checks(call, [&] {
    require_state(State::kReady, call);
    check_unit(unit, call);
    if (units_[unit].gathered != nullptr)
      fail(ZERO_ERR_INVALID_STATE, "zero_gather: " + unit_name(unit) + " is already gathered; release it first");
    test_hooks::maybe_fail("gather", comm_.rank());
    try {
      if (!gathered_pool_.has_free()) test_hooks::maybe_fail("gather.alloc", comm_.rank());
      gathered_pool_.reserve(1);
    } catch (const std::bad_alloc&) {
      fail(ZERO_ERR_OUT_OF_MEMORY,
           "zero_gather: out of memory for the gathered " + unit_name(unit) + " (more units gathered at once?)");
    }
    buffer = gathered_pool_.acquire();
  });
  const int64_t elems = local ? 0 : static_cast<int64_t>(layout_.units[unit].padded_elems);
  try {
    agree(call, CallTag{CallKind::kGather, unit, elems, 0}, local.get());
  } catch (const Error&) {
    if (buffer != nullptr) gathered_pool_.give_back(buffer);
    throw;
  }
  UnitState& us = units_[unit];
  const size_t shard = layout_.units[unit].shard_elems;
  moving_data([&] {
    std::memcpy(static_cast<char*>(buffer) + comm_.rank() * shard * compute_size(), us.params.data(),
                shard * compute_size());
    comm_.all_gather(buffer, shard, elem_type(config_.compute_dtype), "zero_gather: all-gather of " + unit_name(unit));
  });
  us.gathered = buffer;
  us.generation += 1;
}

void Engine::release(int unit) {
  require_state(State::kReady, "zero_release");
  check_unit(unit, "zero_release");
  UnitState& us = units_[unit];
  if (us.gathered == nullptr) fail(ZERO_ERR_INVALID_STATE, "zero_release: " + unit_name(unit) + " is not gathered");
  if (sharded_params(unit)) gathered_pool_.give_back(us.gathered);
  us.gathered = nullptr;
  us.generation += 1;
}

void Engine::grad_ready(int param) {
  const char* call = "zero_grad_ready";
  require_state(State::kReady, call);
  check_param(param, call);
  check_window(call);
  if (param_ready_[param])
    fail(ZERO_ERR_INVALID_STATE,
         "zero_grad_ready: '" + param_name(param) + "' was already declared ready in this micro-step");
  param_ready_[param] = 1;
  param_touched_[param] = 1;
  if (!bucketed_grads() || !param_expected_[param]) return;  // an unexpected param waits for zero_backward_end
  bucket_states_[units_[layout_.params[param].unit].bucket].params_ready += 1;
  reduce_ready_buckets(call);
}

// Buckets are reduced strictly in bucket order, so every rank issues the same sequence of collectives even if
// their backward passes declare gradients ready in a different order.
void Engine::reduce_ready_buckets(const char* call) {
  while (next_bucket_to_reduce_ < static_cast<int>(buckets_.size())) {
    BucketState& bs = bucket_states_[next_bucket_to_reduce_];
    if (bs.params_ready != bs.params_expected) return;
    // A bucket that expects nothing (every param of it unused last time) is not reduced in order: if some rank
    // wrote gradients into it after all, zero_backward_end reduces it.
    if (bs.params_expected > 0) reduce_bucket(next_bucket_to_reduce_, false, call);
    next_bucket_to_reduce_ += 1;
  }
}

// Each unit of the bucket: narrowed in place to the communication dtype, reduce-scattered, and this rank's block
// added into its accumulator. One agreement per bucket: which call triggers a bucket's reduction may differ
// between ranks (zero_grad_ready on one, zero_backward_end on another), the bucket may not.
void Engine::reduce_bucket(int bucket, bool again, const char* call) {
  BucketState& bs = bucket_states_[bucket];
  const Bucket& b = buckets_[bucket];
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
  agree(call, CallTag{CallKind::kReduceBucket, again ? -(bucket + 1) : bucket, static_cast<int64_t>(b.elems), 0},
        local.get());
  moving_data([&] {
    if (bs.buffer == nullptr) {
      bs.buffer = bucket_pool_.acquire();
      std::memset(bs.buffer, 0, b.elems * grad_size());
    }
    const DType accum = config_.grad_accum_dtype, comm_type = config_.comm_dtype;
    const int rank = comm_.rank();
    for (size_t i = 0; i < b.units.size(); ++i) {
      const int u = b.units[i];
      const size_t shard = layout_.units[u].shard_elems;
      char* full = static_cast<char*>(bs.buffer) + b.unit_offsets[i] * grad_size();
      convert(full, comm_type, full, accum, layout_.units[u].padded_elems);
      comm_.reduce_scatter_sum(
          full, shard, elem_type(comm_type),
          std::string(call) + ": reduce-scatter of bucket " + std::to_string(bucket) + ", " + unit_name(u));
      accumulate(units_[u].grads.data(), accum, full + rank * shard * dtype_size(comm_type), comm_type, shard);
    }
    bucket_pool_.give_back(bs.buffer);
    bs.buffer = nullptr;
    bs.reduced = true;
  });
}

// Stages 0-1, in zero_step: the full gradient of a unit, reduced in the communication dtype and back. The reduced
// values land in this rank's block, where the optimizer reads them (stage 1), or everywhere (stage 0).
void Engine::reduce_full_grads(int unit) {
  UnitState& us = units_[unit];
  const DType accum = config_.grad_accum_dtype, comm_type = config_.comm_dtype;
  const size_t full = layout_.units[unit].padded_elems, shard = layout_.units[unit].shard_elems;
  void* g = us.grads.data();
  convert(g, comm_type, g, accum, full);
  if (config_.stage == 0) {
    comm_.all_reduce_sum(g, full, elem_type(comm_type), "zero_step: all-reduce of " + unit_name(unit));
    convert(g, accum, g, comm_type, full);
  } else {
    comm_.reduce_scatter_sum(g, shard, elem_type(comm_type), "zero_step: reduce-scatter of " + unit_name(unit));
    // The rank's block sits at update_begin in the communication dtype; widen it into the accumulation dtype's
    // place for the same elements (at the same byte or entirely after it: convert() allows both).
    convert(us.grads.at(us.update_begin), accum, static_cast<char*>(g) + us.update_begin * dtype_size(comm_type),
            comm_type, shard);
  }
}

// zero_backward_end's second half: buckets that hold gradients no reduction covered — written after their bucket
// was reduced, or into a bucket that expected nothing — on any rank. The ranks exchange which buckets those are, and
// which params had a gradient (what each bucket expects in the next micro-step), in one all-gather of two bitmaps;
// every rank then reduces the same buckets, contributing zeros where it has nothing.
void Engine::reduce_pending_buckets(const char* call) {
  const size_t n_params = params_.size(), n_buckets = buckets_.size();
  const size_t words = (n_params + n_buckets + 63) / 64;
  std::vector<uint64_t> all(words * static_cast<size_t>(comm_.size()), 0);
  uint64_t* mine = all.data() + words * comm_.rank();
  for (size_t p = 0; p < n_params; ++p)
    if (param_touched_[p]) mine[p / 64] |= uint64_t{1} << (p % 64);
  for (size_t b = 0; b < n_buckets; ++b)
    if (bucket_states_[b].buffer != nullptr) mine[(n_params + b) / 64] |= uint64_t{1} << ((n_params + b) % 64);
  comm_.control_all_gather(all.data(), words * sizeof(uint64_t),
                           std::string(call) + ": which params had gradients, which buckets hold unreduced ones");
  std::vector<uint64_t> any(words, 0);
  for (int r = 0; r < comm_.size(); ++r)
    for (size_t w = 0; w < words; ++w) any[w] |= all[words * r + w];
  auto bit = [&](size_t i) { return (any[i / 64] >> (i % 64)) & 1u; };
  for (size_t b = 0; b < n_buckets; ++b)
    if (bit(n_params + b)) reduce_bucket(static_cast<int>(b), true, call);
  for (auto& bs : bucket_states_) bs.params_expected = 0;
  for (size_t p = 0; p < n_params; ++p) {
    param_expected_[p] = static_cast<char>(bit(p));
    if (param_expected_[p]) bucket_states_[units_[layout_.params[p].unit].bucket].params_expected += 1;
  }
}

void Engine::backward_end() {
  const char* call = "zero_backward_end";
  // A rank whose call is wrong (too many micro-steps, not finalized) still joins the agreement, so the others hear
  // of it.
  std::unique_ptr<Error> local = local_checks(call, [&] {
    require_state(State::kReady, call);
    check_window(call);
    test_hooks::maybe_fail("backward_end", comm_.rank());
  });
  if (!local && bucketed_grads())
    while (next_bucket_to_reduce_ < static_cast<int>(buckets_.size())) {
      if (bucket_states_[next_bucket_to_reduce_].params_expected > 0)
        reduce_bucket(next_bucket_to_reduce_, false, call);
      next_bucket_to_reduce_ += 1;
    }
  agree(call, CallTag{CallKind::kBackwardEnd, micro_step_count_ + 1, 0, 0}, local.get());
  if (bucketed_grads()) {
    moving_data([&] { reduce_pending_buckets(call); });
    for (auto& bs : bucket_states_) bs.params_ready = 0, bs.reduced = false;
    next_bucket_to_reduce_ = 0;
    bucket_pool_.trim(1);  // what a micro-step held beyond one bucket goes back (the first one can hold more)
  }
  std::fill(param_ready_.begin(), param_ready_.end(), 0);
  std::fill(param_touched_.begin(), param_touched_.end(), 0);
  micro_steps_ += 1;
  micro_step_count_ += 1;
}

}  // namespace zero
