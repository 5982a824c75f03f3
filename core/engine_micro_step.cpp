// The micro-step: gathering and releasing units, gradient buffers and their reduction in buckets.
#include <cstring>

#include "convert.hpp"
#include "engine.hpp"
#include "error.hpp"

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
  if (sharded_params(pl.unit)) {
    if (us.gathered == nullptr)
      fail(ZERO_ERR_INVALID_STATE, "zero_param_data: param '" + param_name(param) + "' lives in " + unit_name(pl.unit) +
                                       ", which is not gathered; call zero_gather(engine, " + std::to_string(pl.unit) +
                                       ") first");
    return static_cast<char*>(us.gathered) + pl.offset * compute_size();
  }
  return us.params.at(pl.offset);
}

void* Engine::grad_data(int param) {
  require_state(State::kReady, "zero_grad_data");
  check_param(param, "zero_grad_data");
  check_window("zero_grad_data");
  const ParamPlacement& pl = layout_.params[param];
  UnitState& us = units_[pl.unit];
  if (!bucketed_grads()) return us.grads.at(pl.offset);
  BucketState& bs = bucket_states_[us.bucket];
  if (param_ready_[param] || bs.reduced)
    fail(ZERO_ERR_INVALID_STATE, "zero_grad_data: the gradient of '" + param_name(param) +
                                     "' was already declared ready (and may be reduced) in this micro-step");
  if (bs.buffer == nullptr) {
    bs.buffer = bucket_pool_.acquire();
    std::memset(bs.buffer, 0, buckets_[us.bucket].elems * grad_size());
  }
  return static_cast<char*>(bs.buffer) + (us.offset_in_bucket + pl.offset) * grad_size();
}

void Engine::gather(int unit) {
  require_state(State::kReady, "zero_gather");
  check_unit(unit, "zero_gather");
  UnitState& us = units_[unit];
  if (us.gathered != nullptr)
    fail(ZERO_ERR_INVALID_STATE, "zero_gather: " + unit_name(unit) + " is already gathered; release it first");
  if (!sharded_params(unit)) {
    us.gathered = us.params.data();  // resident: gathering only records the unit as in use
    return;
  }
  const size_t shard = layout_.units[unit].shard_elems;
  void* buffer = gathered_pool_.acquire();
  std::memcpy(static_cast<char*>(buffer) + comm_.rank() * shard * compute_size(), us.params.data(),
              shard * compute_size());
  try {
    comm_.all_gather_inplace(buffer, shard, elem_type(config_.compute_dtype));
  } catch (const Error& e) {
    gathered_pool_.give_back(buffer);
    broken(e);
  }
  us.gathered = buffer;
}

void Engine::release(int unit) {
  require_state(State::kReady, "zero_release");
  check_unit(unit, "zero_release");
  UnitState& us = units_[unit];
  if (us.gathered == nullptr) fail(ZERO_ERR_INVALID_STATE, "zero_release: " + unit_name(unit) + " is not gathered");
  if (sharded_params(unit)) gathered_pool_.give_back(us.gathered);
  us.gathered = nullptr;
}

void Engine::grad_ready(int param) {
  require_state(State::kReady, "zero_grad_ready");
  check_param(param, "zero_grad_ready");
  check_window("zero_grad_ready");
  if (param_ready_[param])
    fail(ZERO_ERR_INVALID_STATE,
         "zero_grad_ready: '" + param_name(param) + "' was already declared ready in this micro-step");
  param_ready_[param] = 1;
  if (!bucketed_grads()) return;
  bucket_states_[units_[layout_.params[param].unit].bucket].params_ready += 1;
  try {
    reduce_ready_buckets();
  } catch (const Error& e) {
    broken(e);
  }
}

// Buckets are reduced strictly in bucket order, so every rank issues the same sequence of collectives even if
// their backward passes declare gradients ready in a different order.
void Engine::reduce_ready_buckets() {
  while (next_bucket_to_reduce_ < static_cast<int>(buckets_.size())) {
    BucketState& bs = bucket_states_[next_bucket_to_reduce_];
    if (bs.params_ready != bs.params_total) return;
    reduce_bucket(next_bucket_to_reduce_++);
  }
}

// Each unit of the bucket: narrowed in place to the communication dtype, reduce-scattered, and this rank's block
// added into its accumulator.
void Engine::reduce_bucket(int bucket) {
  BucketState& bs = bucket_states_[bucket];
  const Bucket& b = buckets_[bucket];
  if (bs.buffer == nullptr) {  // no gradient was asked for: this rank contributes zeros
    bs.buffer = bucket_pool_.acquire();
    std::memset(bs.buffer, 0, b.elems * grad_size());
  }
  const DType accum = config_.grad_accum_dtype, comm_type = config_.comm_dtype;
  for (size_t i = 0; i < b.units.size(); ++i) {
    const int u = b.units[i];
    const size_t shard = layout_.units[u].shard_elems;
    void* full = static_cast<char*>(bs.buffer) + b.unit_offsets[i] * grad_size();
    convert(full, comm_type, full, accum, layout_.units[u].padded_elems);
    comm_.reduce_scatter_sum_inplace(full, shard, elem_type(comm_type));
    accumulate(units_[u].grads.data(), accum, full, comm_type, shard);
  }
  bucket_pool_.give_back(bs.buffer);
  bs.buffer = nullptr;
  bs.reduced = true;
}

// Stages 0-1, in zero_step: the full gradient of a unit, reduced in the communication dtype and back.
void Engine::reduce_full_grads(int unit) {
  UnitState& us = units_[unit];
  const DType accum = config_.grad_accum_dtype, comm_type = config_.comm_dtype;
  const size_t full = layout_.units[unit].padded_elems, shard = layout_.units[unit].shard_elems;
  void* g = us.grads.data();
  convert(g, comm_type, g, accum, full);
  if (config_.stage == 0) {
    comm_.all_reduce_inplace(g, full, elem_type(comm_type), ReduceOp::kSum);
    convert(g, accum, g, comm_type, full);
  } else {
    comm_.reduce_scatter_sum_inplace(g, shard, elem_type(comm_type));
    convert(us.grads.at(us.update_begin), accum, g, comm_type, shard);  // dst is after src, or the same place
  }
}

void Engine::backward_end() {
  require_state(State::kReady, "zero_backward_end");
  check_window("zero_backward_end");
  if (bucketed_grads()) {
    try {
      while (next_bucket_to_reduce_ < static_cast<int>(buckets_.size())) reduce_bucket(next_bucket_to_reduce_++);
    } catch (const Error& e) {
      broken(e);
    }
    for (auto& bs : bucket_states_) bs.params_ready = 0, bs.reduced = false;
    next_bucket_to_reduce_ = 0;
  }
  std::fill(param_ready_.begin(), param_ready_.end(), 0);
  micro_steps_ += 1;
}

}  // namespace zero
