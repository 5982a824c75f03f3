#include "engine.hpp"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <unordered_set>

#include "error.hpp"

namespace zero {
namespace {

std::string unit_name(int unit) { return "unit " + std::to_string(unit); }

}  // namespace

// ---------------------------------------------------------------------------------------------------------------
// Pool

float* Engine::Pool::acquire() {
  if (free_.empty()) {
    all_.push_back(std::make_unique<FloatBuffer>(capacity_));
    free_.push_back(all_.back()->data());
  }
  float* buffer = free_.back();
  free_.pop_back();
  return buffer;
}

void Engine::Pool::give_back(float* buffer) { free_.push_back(buffer); }

uint64_t Engine::Pool::allocated_bytes() const {
  uint64_t total = 0;
  for (const auto& b : all_) total += b->n_bytes();
  return total;
}

// ---------------------------------------------------------------------------------------------------------------
// Registration

Engine::Engine(Config config, std::shared_ptr<Communicator> comm) : config_(std::move(config)), comm_(std::move(comm)) {
  GroupSpec base;
  base.name = "default";
  const OptimizerConfig& o = config_.optimizer;
  base.hyper.decoupled_weight_decay = o.kind == OptimizerConfig::Kind::kAdamW;
  base.hyper.bias_correction = o.bias_correction;
  base.hyper.lr = o.lr;
  base.hyper.beta1 = o.beta1;
  base.hyper.beta2 = o.beta2;
  base.hyper.eps = o.eps;
  base.hyper.weight_decay = o.weight_decay;
  groups_.push_back(base);
  if (comm_.rank() == 0 && !config_.no_effect_keys.empty()) {
    std::string keys;
    for (const auto& k : config_.no_effect_keys) keys += (keys.empty() ? "" : ", ") + k;
    std::fprintf(stderr, "libzero: warning: these config keys are valid but have no effect yet: %s\n", keys.c_str());
  }
}

void Engine::require_state(State wanted, const char* call) const {
  if (state_ == wanted) return;
  if (state_ == State::kBroken)
    fail(ZERO_ERR_INVALID_STATE,
         std::string(call) + ": the engine is unusable after an earlier failure (" + broken_reason_ + "); destroy it");
  if (wanted == State::kRegistering)
    fail(ZERO_ERR_INVALID_STATE, std::string(call) + " must come before zero_engine_finalize");
  fail(ZERO_ERR_INVALID_STATE, std::string(call) + " needs zero_engine_finalize first");
}

void Engine::check_param(int param, const char* call) const {
  if (param < 0 || param >= static_cast<int>(params_.size()))
    fail(ZERO_ERR_INVALID_ARGUMENT, std::string(call) + ": no param with id " + std::to_string(param) +
                                        " (ids are 0.." + std::to_string(params_.size()) + "-1)");
}

void Engine::check_unit(int unit, const char* call) const {
  if (unit < 0 || unit >= static_cast<int>(units_.size()))
    fail(ZERO_ERR_INVALID_ARGUMENT, std::string(call) + ": no unit " + std::to_string(unit) + " (units are 0.." +
                                        std::to_string(units_.size()) + "-1)");
}

void Engine::broken(const std::exception& e) {
  state_ = State::kBroken;
  broken_reason_ = e.what();
  throw;
}

int Engine::add_param_group(const std::string& name, double lr, double weight_decay, double beta1, double beta2,
                            double eps) {
  require_state(State::kRegistering, "zero_engine_add_param_group");
  GroupSpec g = groups_[0];
  g.name = name.empty() ? "group " + std::to_string(groups_.size()) : name;
  auto take = [&](double value, double& field, const char* what, double lo, double hi) {
    if (value == -1.0) return;  // ZERO_INHERIT
    if (!(value >= lo && value < hi))
      fail(ZERO_ERR_INVALID_ARGUMENT, "param group '" + g.name + "': " + what + " = " + std::to_string(value) +
                                          " is out of range (use ZERO_INHERIT to keep the config's value)");
    field = value;
  };
  take(lr, g.hyper.lr, "lr", 0.0, 1e6);
  take(weight_decay, g.hyper.weight_decay, "weight_decay", 0.0, 1e6);
  take(beta1, g.hyper.beta1, "beta1", 0.0, 1.0);
  take(beta2, g.hyper.beta2, "beta2", 0.0, 1.0);
  take(eps, g.hyper.eps, "eps", 0.0, 1.0);
  groups_.push_back(g);
  return static_cast<int>(groups_.size()) - 1;
}

int Engine::add_param(ParamShape shape, const void* init_data) {
  require_state(State::kRegistering, "zero_engine_add_param");
  if (shape.name.empty()) fail(ZERO_ERR_INVALID_ARGUMENT, "zero_engine_add_param: the param name is empty");
  for (const auto& p : params_)
    if (p.name == shape.name)
      fail(ZERO_ERR_INVALID_ARGUMENT, "zero_engine_add_param: a param named '" + shape.name + "' already exists");
  for (int64_t d : shape.dims)
    if (d <= 0) fail(ZERO_ERR_INVALID_ARGUMENT, "param '" + shape.name + "': every extent must be positive");
  if (shape.unit < 0) fail(ZERO_ERR_INVALID_ARGUMENT, "param '" + shape.name + "': unit must be >= 0");
  if (shape.group < 0 || shape.group >= static_cast<int>(groups_.size()))
    fail(ZERO_ERR_INVALID_ARGUMENT, "param '" + shape.name + "': no param group " + std::to_string(shape.group) +
                                        " (add groups with zero_engine_add_param_group first)");
  // MPI counts are int: keep every unit's messages below 2^31 elements.
  if (shape.numel() >= (size_t{1} << 31) / 2)
    fail(ZERO_ERR_UNSUPPORTED, "param '" + shape.name + "' has more than 2^30 elements; split it");
  params_.push_back(std::move(shape));
  init_data_.push_back(init_data);
  return static_cast<int>(params_.size()) - 1;
}

// ---------------------------------------------------------------------------------------------------------------
// Finalize

void Engine::finalize() {
  require_state(State::kRegistering, "zero_engine_finalize");
  try {
    verify_registration_across_ranks();
    allocate();
    load_initial_values();
  } catch (const Error& e) {
    if (e.status() == ZERO_ERR_COMM) broken(e);
    throw;
  }
  param_ready_.assign(params_.size(), 0);
  state_ = State::kReady;
}

void Engine::allocate() {
  const int rank = comm_.rank();
  const int stage = config_.stage;
  units_.clear();
  units_.resize(layout_.units.size());
  size_t largest_gathered = 0;
  for (size_t u = 0; u < units_.size(); ++u) {
    const UnitLayout& ul = layout_.units[u];
    UnitState& us = units_[u];
    const size_t full = ul.padded_elems, shard = ul.shard_elems;
    us.persistent = stage == 3 && ul.used_elems < static_cast<size_t>(config_.param_persistence_threshold);
    if (sharded_params(static_cast<int>(u))) {
      us.shard_params.resize(shard);
      largest_gathered = std::max(largest_gathered, full);
    } else {
      us.full_params.resize(full);
    }
    if (stage <= 1) {
      us.full_grads.resize(full);
    } else {
      us.grad_shard.resize(shard);
    }
    size_t state_elems = stage == 0 ? full : shard;
    us.exp_avg.resize(state_elems);
    us.exp_avg_sq.resize(state_elems);
    // Stage 0 updates the whole unit on every rank; the other stages update this rank's shard only.
    size_t begin = stage == 0 ? 0 : rank * shard;
    us.segments = layout_.segments(static_cast<int>(u), begin, state_elems, params_);
  }
  gathered_pool_.set_capacity(largest_gathered);
  if (bucketed_grads()) {
    buckets_ = build_buckets(layout_, config_.reduce_bucket_size);
    size_t largest_bucket = 0;
    bucket_states_.assign(buckets_.size(), BucketState{});
    for (size_t b = 0; b < buckets_.size(); ++b) {
      largest_bucket = std::max(largest_bucket, buckets_[b].elems);
      for (size_t i = 0; i < buckets_[b].units.size(); ++i) {
        int u = buckets_[b].units[i];
        units_[u].bucket = static_cast<int>(b);
        units_[u].offset_in_bucket = buckets_[b].unit_offsets[i];
        bucket_states_[b].params_total += layout_.units[u].params.size();
      }
    }
    bucket_pool_.set_capacity(largest_bucket);
  }
}

// Rank 0's initial values reach every rank one unit at a time, so no rank ever holds more than one extra unit.
void Engine::load_initial_values() {
  const int rank = comm_.rank();
  std::vector<float> staging;
  for (size_t u = 0; u < units_.size(); ++u) {
    const UnitLayout& ul = layout_.units[u];
    UnitState& us = units_[u];
    float* target = us.full_params.data();
    if (target == nullptr) {
      staging.assign(ul.padded_elems, 0.0f);
      target = staging.data();
    }
    if (rank == 0) {
      for (int p : ul.params)
        if (init_data_[p] != nullptr)
          std::memcpy(target + layout_.params[p].offset, init_data_[p], layout_.params[p].numel * sizeof(float));
    }
    comm_.broadcast(target, ul.padded_elems * sizeof(float), 0);
    if (!us.shard_params.empty())
      std::memcpy(us.shard_params.data(), target + rank * ul.shard_elems, ul.shard_elems * sizeof(float));
  }
  init_data_.assign(init_data_.size(), nullptr);  // the caller's pointers are no longer needed, nor valid
}

float* Engine::unit_params_shard(int unit) {
  UnitState& us = units_[unit];
  if (!us.shard_params.empty()) return us.shard_params.data();
  if (config_.stage == 0) return us.full_params.data();
  return us.full_params.data() + comm_.rank() * layout_.units[unit].shard_elems;
}

float* Engine::unit_grads_shard(int unit) {
  UnitState& us = units_[unit];
  if (!us.grad_shard.empty()) return us.grad_shard.data();
  if (config_.stage == 0) return us.full_grads.data();
  return us.full_grads.data() + comm_.rank() * layout_.units[unit].shard_elems;
}

// ---------------------------------------------------------------------------------------------------------------
// Micro-step

float* Engine::param_data(int param) {
  require_state(State::kReady, "zero_param_data");
  check_param(param, "zero_param_data");
  const ParamPlacement& pl = layout_.params[param];
  UnitState& us = units_[pl.unit];
  if (sharded_params(pl.unit)) {
    if (us.gathered == nullptr)
      fail(ZERO_ERR_INVALID_STATE, "zero_param_data: param '" + param_name(param) + "' lives in " + unit_name(pl.unit) +
                                       ", which is not gathered; call zero_gather(engine, " + std::to_string(pl.unit) +
                                       ") first");
    return us.gathered + pl.offset;
  }
  return us.full_params.data() + pl.offset;
}

float* Engine::grad_data(int param) {
  require_state(State::kReady, "zero_grad_data");
  check_param(param, "zero_grad_data");
  if (micro_steps_ == config_.gradient_accumulation_steps)
    fail(ZERO_ERR_INVALID_STATE, "zero_grad_data: gradient_accumulation_steps (" +
                                     std::to_string(config_.gradient_accumulation_steps) +
                                     ") micro-steps are complete; call zero_step first");
  const ParamPlacement& pl = layout_.params[param];
  UnitState& us = units_[pl.unit];
  if (!bucketed_grads()) return us.full_grads.data() + pl.offset;
  BucketState& bs = bucket_states_[us.bucket];
  if (param_ready_[param] || bs.reduced)
    fail(ZERO_ERR_INVALID_STATE, "zero_grad_data: the gradient of '" + param_name(param) +
                                     "' was already declared ready (and may be reduced) in this micro-step");
  if (bs.buffer == nullptr) {
    bs.buffer = bucket_pool_.acquire();
    std::memset(bs.buffer, 0, buckets_[us.bucket].elems * sizeof(float));
  }
  return bs.buffer + us.offset_in_bucket + pl.offset;
}

void Engine::gather(int unit) {
  require_state(State::kReady, "zero_gather");
  check_unit(unit, "zero_gather");
  UnitState& us = units_[unit];
  if (us.gathered != nullptr)
    fail(ZERO_ERR_INVALID_STATE, "zero_gather: " + unit_name(unit) + " is already gathered; release it first");
  if (!sharded_params(unit)) {
    us.gathered = us.full_params.data();  // resident: gathering only records the unit as in use
    return;
  }
  const size_t shard = layout_.units[unit].shard_elems;
  float* buffer = gathered_pool_.acquire();
  std::memcpy(buffer + comm_.rank() * shard, us.shard_params.data(), shard * sizeof(float));
  try {
    comm_.all_gather_inplace(buffer, shard);
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
  if (micro_steps_ == config_.gradient_accumulation_steps)
    fail(ZERO_ERR_INVALID_STATE, "zero_grad_ready: gradient_accumulation_steps (" +
                                     std::to_string(config_.gradient_accumulation_steps) +
                                     ") micro-steps are complete; call zero_step first");
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

void Engine::reduce_bucket(int bucket) {
  BucketState& bs = bucket_states_[bucket];
  const Bucket& b = buckets_[bucket];
  if (bs.buffer == nullptr) {  // no gradient was asked for: this rank contributes zeros
    bs.buffer = bucket_pool_.acquire();
    std::memset(bs.buffer, 0, b.elems * sizeof(float));
  }
  for (size_t i = 0; i < b.units.size(); ++i) {
    const int u = b.units[i];
    const size_t shard = layout_.units[u].shard_elems;
    float* full = bs.buffer + b.unit_offsets[i];
    comm_.reduce_scatter_sum_inplace(full, shard);
    float* acc = units_[u].grad_shard.data();
    for (size_t e = 0; e < shard; ++e) acc[e] += full[e];
  }
  bucket_pool_.give_back(bs.buffer);
  bs.buffer = nullptr;
  bs.reduced = true;
}

void Engine::backward_end() {
  require_state(State::kReady, "zero_backward_end");
  if (micro_steps_ == config_.gradient_accumulation_steps)
    fail(ZERO_ERR_INVALID_STATE, "zero_backward_end: gradient_accumulation_steps (" +
                                     std::to_string(config_.gradient_accumulation_steps) +
                                     ") micro-steps are complete; call zero_step first");
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

// ---------------------------------------------------------------------------------------------------------------
// Step

StepResult Engine::step() {
  require_state(State::kReady, "zero_step");
  if (micro_steps_ != config_.gradient_accumulation_steps)
    fail(ZERO_ERR_INVALID_STATE,
         "zero_step: expected gradient_accumulation_steps (" + std::to_string(config_.gradient_accumulation_steps) +
             ") calls of zero_backward_end since the last step, got " + std::to_string(micro_steps_));
  for (size_t u = 0; u < units_.size(); ++u)
    if (units_[u].gathered != nullptr)
      fail(ZERO_ERR_INVALID_STATE,
           "zero_step: " + unit_name(static_cast<int>(u)) + " is still gathered; release every unit first");
  const int stage = config_.stage;
  const int world = comm_.size();
  StepResult result;
  try {
    // 1. Finish the reduction. Stages 2-3 reduced bucket by bucket during backward.
    for (size_t u = 0; u < units_.size(); ++u) {
      UnitState& us = units_[u];
      const size_t shard = layout_.units[u].shard_elems;
      if (stage == 0) {
        comm_.all_reduce_inplace(us.full_grads.data(), us.full_grads.size(), ElemType::kF32, ReduceOp::kSum);
      } else if (stage == 1) {
        comm_.reduce_scatter_sum_inplace(us.full_grads.data(), shard);
        float* own = us.full_grads.data() + comm_.rank() * shard;
        if (own != us.full_grads.data()) std::memcpy(own, us.full_grads.data(), shard * sizeof(float));
      }
    }

    // 2. Global norm of the summed gradients, in fp64: the squares of small multiples of 2^-10 and their sums
    //    are exact there, so the norm does not depend on how the shards split the sum.
    double sum_sq = 0.0;
    for (size_t u = 0; u < units_.size(); ++u) {
      const float* g = unit_grads_shard(static_cast<int>(u));
      for (const ShardSegment& s : units_[u].segments)
        for (size_t i = 0; i < s.numel; ++i) {
          double x = g[s.shard_offset + i];
          sum_sq += x * x;
        }
    }
    if (stage != 0) comm_.all_reduce_inplace(&sum_sq, 1, ElemType::kF64, ReduceOp::kSum);
    const double samples = static_cast<double>(world) * static_cast<double>(config_.gradient_accumulation_steps);
    result.grad_norm = std::sqrt(sum_sq) / samples;
    result.lr = groups_[0].hyper.lr;

    if (!std::isfinite(result.grad_norm)) {
      result.skipped = true;  // an inf/nan gradient would poison the moments: skip, as DeepSpeed does
    } else {
      // 3. Average and clip with one multiply per element.
      double clip = 1.0;
      if (config_.gradient_clipping > 0.0 && result.grad_norm > config_.gradient_clipping)
        clip = config_.gradient_clipping / (result.grad_norm + 1e-6);
      const float factor = static_cast<float>(clip / samples);
      steps_ += 1;
      for (size_t u = 0; u < units_.size(); ++u) {
        UnitState& us = units_[u];
        float* p = unit_params_shard(static_cast<int>(u));
        const float* g = unit_grads_shard(static_cast<int>(u));
        for (const ShardSegment& s : us.segments)
          adam_update(p + s.shard_offset, g + s.shard_offset, us.exp_avg.data() + s.shard_offset,
                      us.exp_avg_sq.data() + s.shard_offset, s.numel, factor, groups_[s.group].hyper, steps_);
      }
    }

    // 4. Clear the gradients and publish the new parameters.
    for (size_t u = 0; u < units_.size(); ++u) {
      UnitState& us = units_[u];
      us.full_grads.zero();
      us.grad_shard.zero();
      if (stage >= 1 && !us.full_params.empty())
        comm_.all_gather_inplace(us.full_params.data(), layout_.units[u].shard_elems);
    }
  } catch (const Error& e) {
    if (e.status() == ZERO_ERR_COMM) broken(e);
    throw;
  }
  micro_steps_ = 0;
  result.step = steps_;
  return result;
}

void Engine::set_lr(int group, double lr) {
  if (state_ == State::kBroken) require_state(State::kReady, "zero_set_lr");
  if (!(lr >= 0.0 && std::isfinite(lr)))
    fail(ZERO_ERR_INVALID_ARGUMENT, "zero_set_lr: lr must be a finite number >= 0, got " + std::to_string(lr));
  if (group == -1) {
    for (auto& g : groups_) g.hyper.lr = lr;
    return;
  }
  if (group < 0 || group >= static_cast<int>(groups_.size()))
    fail(ZERO_ERR_INVALID_ARGUMENT, "zero_set_lr: no param group " + std::to_string(group));
  groups_[group].hyper.lr = lr;
}

MemoryStats Engine::memory_stats() const {
  MemoryStats s;
  for (const auto& us : units_) {
    s.param_bytes += us.full_params.n_bytes() + us.shard_params.n_bytes();
    s.grad_bytes += us.full_grads.n_bytes() + us.grad_shard.n_bytes();
    s.optimizer_state_bytes += us.exp_avg.n_bytes() + us.exp_avg_sq.n_bytes();
  }
  s.bucket_bytes = bucket_pool_.allocated_bytes();
  s.gathered_bytes = gathered_pool_.allocated_bytes();
  return s;
}

}  // namespace zero
