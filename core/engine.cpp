// Registration, layout, allocation, initial values and what the engine reports about itself.
#include "engine.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "convert.hpp"
#include "error.hpp"
#include "log.hpp"
#include "test_hooks.hpp"
#include "utf8.hpp"

namespace zero {

// ---------------------------------------------------------------------------------------------------------------
// Pool

void Engine::Pool::reserve(size_t buffers) {
  while (free_.size() < buffers) {
    all_.push_back(std::make_unique<Buffer>(capacity_, dtype_));
    free_.push_back(all_.back()->data());
  }
}

void* Engine::Pool::acquire() {
  if (free_.empty()) fail(ZERO_ERR_INTERNAL, "a pooled buffer was taken without being reserved first");
  void* buffer = free_.back();
  free_.pop_back();
  return buffer;
}

uint64_t Engine::Pool::allocated_bytes() const {
  uint64_t total = 0;
  for (const auto& b : all_) total += b->n_bytes();
  return total;
}

void Engine::Pool::trim(size_t keep) {
  if (free_.size() != all_.size()) return;  // some are in use: never free those
  while (all_.size() > keep) {
    free_.erase(std::find(free_.begin(), free_.end(), all_.back()->data()));
    all_.pop_back();
  }
}

void Engine::Pool::leak() {
  for (auto& b : all_) b->leak();
}

// ---------------------------------------------------------------------------------------------------------------
// Registration

namespace {

// Ranks on one node share its cores: each gets its share of OpenMP threads for the optimizer, so a node never
// runs more busy threads than cores. OMP_NUM_THREADS, when set, decides instead (0: OpenMP's own default).
int automatic_threads(int ranks_on_node) {
  if (std::getenv("OMP_NUM_THREADS") != nullptr) return 0;
  const int cores = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  return std::max(1, cores / std::max(1, ranks_on_node));
}

}  // namespace

Engine::Engine(Config config, std::shared_ptr<Communicator> comm)
    : config_(std::move(config)), comm_(std::move(comm)), isa_(active_isa()) {
  GroupSpec base;
  base.name = "default";
  base.hyper = config_.optimizer;
  base.base_lr = config_.optimizer.lr;
  groups_.push_back(base);
  scaler_ = LossScaler(config_.loss_scale, config_.compute_dtype == DType::kF16);
  comm_.set_timeout(config_.timeout_s);
  threads_requested_ = config_.optimizer_threads;
  threads_ = threads_requested_ > 0 ? threads_requested_ : automatic_threads(comm_.local_size());
  for (const std::string& w : config_.warnings) log_message(ZERO_LOG_WARNING, comm_.rank(), w);
  if (!config_.no_effect_keys.empty()) {
    std::string keys;
    for (const auto& k : config_.no_effect_keys) keys += (keys.empty() ? "" : ", ") + k;
    log_message(ZERO_LOG_WARNING, comm_.rank(), "these config keys are valid but have no effect in libzero: " + keys);
  }
}

Engine::~Engine() {
  // A collective given up after a timeout (or a failure while in flight) may still be written by the backend:
  // its buffers must outlive the engine. Leaking them is the price of never crashing.
  if (comm_.abandoned_requests()) {
    for (auto& us : units_) {
      us.params.leak();
      us.grads.leak();
    }
    gathered_pool_.leak();
    bucket_pool_.leak();
  }
}

void Engine::require_state(State wanted, const char* call) const {
  if (aborted_.load()) fail(ZERO_ERR_ABORTED, std::string(call) + ": zero_engine_abort was called on this engine");
  if (state_ == State::kBroken)
    fail(ZERO_ERR_INVALID_STATE,
         std::string(call) + ": the engine is unusable after an earlier failure (" + broken_reason_ + "); destroy it");
  if (comm_.backend().aborted())
    fail(ZERO_ERR_ABORTED, std::string(call) + ": the engine's communicator was aborted on this rank (" +
                               comm_.backend().abort_reason() + ")");
  if (state_ == wanted) return;
  if (wanted == State::kRegistering) {
    if (std::string(call) == "zero_engine_finalize")
      fail(ZERO_ERR_INVALID_STATE, "zero_engine_finalize: the engine is already finalized");
    fail(ZERO_ERR_INVALID_STATE, std::string(call) + " must come before zero_engine_finalize");
  }
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
  comm_.abort("it failed: " + broken_reason_);
  throw;
}

void Engine::agree(const char* call, const CallTag& tag, const Error* local, const EngineComm::ExplainCheck& explain,
                   bool share_status) {
  try {
    comm_.agree(call, tag, local, explain, share_status);
  } catch (const Error& e) {
    if (e.status() == ZERO_ERR_MISMATCH || comm_.failed()) broken(e);
    throw;
  }
}

void Engine::abort() {
  aborted_.store(true);
  comm_.abort("zero_engine_abort was called on rank " + std::to_string(comm_.rank()));  // the rank, for the others
}

void Engine::set_num_threads(int threads) {
  if (threads < 0 || threads > 4096)  // the range of libzero.optimizer_threads
    fail(ZERO_ERR_INVALID_ARGUMENT, "zero_engine_set_num_threads: threads must be in [0, 4096]");
  threads_requested_ = threads;
  threads_ = threads > 0 ? threads : automatic_threads(comm_.local_size());
}

int Engine::add_param_group(const std::string& name, double lr, double weight_decay, double beta1, double beta2,
                            double eps) {
  require_state(State::kRegistering, "zero_engine_add_param_group");
  if (!is_valid_utf8(name))
    fail(ZERO_ERR_INVALID_ARGUMENT, "zero_engine_add_param_group: the group name is not valid UTF-8");
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
  g.base_lr = g.hyper.lr;
  groups_.push_back(g);
  return static_cast<int>(groups_.size()) - 1;
}

int Engine::add_param(ParamShape shape, ParamInit init) {
  require_state(State::kRegistering, "zero_engine_add_param");
  if (shape.name.empty()) fail(ZERO_ERR_INVALID_ARGUMENT, "zero_engine_add_param: the param name is empty");
  if (!is_valid_utf8(shape.name))
    fail(ZERO_ERR_INVALID_ARGUMENT,
         "zero_engine_add_param: the param name is not valid UTF-8 (names are written "
         "into checkpoints, which are JSON)");
  for (const auto& p : params_)
    if (p.name == shape.name)
      fail(ZERO_ERR_INVALID_ARGUMENT, "zero_engine_add_param: a param named '" + shape.name + "' already exists");
  // Elements must fit with room to spare: every byte count below multiplies them by at most 8.
  uint64_t numel = 1;
  for (int64_t d : shape.dims) {
    if (d <= 0) fail(ZERO_ERR_INVALID_ARGUMENT, "param '" + shape.name + "': every extent must be positive");
    if (static_cast<uint64_t>(d) > kMaxModelElems / numel)
      fail(ZERO_ERR_INVALID_ARGUMENT, "param '" + shape.name + "': its shape has more than 2^56 elements");
    numel *= static_cast<uint64_t>(d);
  }
  if (shape.unit < 0) fail(ZERO_ERR_INVALID_ARGUMENT, "param '" + shape.name + "': unit must be >= 0");
  if (shape.group < 0 || shape.group >= static_cast<int>(groups_.size()))
    fail(ZERO_ERR_INVALID_ARGUMENT, "param '" + shape.name + "': no param group " + std::to_string(shape.group) +
                                        " (add groups with zero_engine_add_param_group first)");
  params_.push_back(std::move(shape));
  init_.push_back(init);
  return static_cast<int>(params_.size()) - 1;
}

const ParamShape& Engine::param_shape(int param) const {
  check_param(param, "zero_param_info");
  return params_[param];
}

UnitInfo Engine::unit_info(int unit) const {
  require_state(State::kReady, "zero_unit_info");
  check_unit(unit, "zero_unit_info");
  UnitInfo info;
  const UnitState& us = units_[unit];
  info.gathered = us.gathered != nullptr;
  info.generation = us.generation;
  info.num_params = static_cast<int>(layout_.units[unit].params.size());
  for (int p : layout_.units[unit].params) info.numel += layout_.params[p].numel;
  return info;
}

// ---------------------------------------------------------------------------------------------------------------
// Finalize: agree on the registration, allocate, agree that every rank could, then move the initial values.

void Engine::finalize() {
  const char* call = "zero_engine_finalize";
  std::unique_ptr<Error> local = local_checks(call, [&] { require_state(State::kRegistering, call); });
  try {
    verify_registration_across_ranks(local.get());
  } catch (const Error& e) {
    if (comm_.failed()) broken(e);  // the exchange itself failed: the collective sequences are apart
    throw;
  }
  std::unique_ptr<Error> allocation_error;
  try {
    allocate();
  } catch (const Error& e) {
    allocation_error = std::make_unique<Error>(e);
  } catch (const std::bad_alloc&) {
    allocation_error = std::make_unique<Error>(ZERO_ERR_OUT_OF_MEMORY,
                                               std::string(call) + ": out of memory allocating this rank's buffers (" +
                                                   std::to_string(layout_.total_padded_elems()) + " padded elements)");
  }
  if (allocation_error) {
    units_.clear();
    bucket_states_.clear();
    buckets_.clear();
  }
  CallTag tag{CallKind::kFinalize, 0, static_cast<int64_t>(layout_.total_padded_elems()), 0};
  try {
    agree(call, tag, allocation_error.get());
  } catch (const Error&) {
    if (!allocation_error) units_.clear(), bucket_states_.clear(), buckets_.clear();
    throw;
  }
  moving_data([&] { load_initial_values(); });
  param_ready_.assign(params_.size(), 0);
  param_touched_.assign(params_.size(), 0);
  param_expected_.assign(params_.size(), 1);
  state_ = State::kReady;
  if (comm_.rank() == 0 && log_enabled(ZERO_LOG_INFO)) {
    const MemoryStats m = memory_stats();
    auto mib = [](uint64_t b) { return std::to_string((b + (1 << 19)) >> 20) + " MiB"; };
    log_message(ZERO_LOG_INFO, 0,
                "zero_engine_finalize: stage " + std::to_string(config_.stage) + " over " +
                    std::to_string(comm_.size()) + " ranks, " + std::to_string(params_.size()) + " params in " +
                    std::to_string(units_.size()) + " units (" + std::to_string(layout_.total_padded_elems()) +
                    " padded elements); rank 0 holds " + mib(m.total()) + ": params " + mib(m.param_bytes) +
                    ", gradients " + mib(m.grad_bytes) + ", fp32 master " + mib(m.master_param_bytes) +
                    ", optimizer state " + mib(m.optimizer_state_bytes) + ", buckets " + mib(m.bucket_bytes) +
                    ", gathered units " + mib(m.gathered_bytes) + "; optimizer on the " + isa_name(active_isa()) +
                    " path with " + std::to_string(threads_) + " thread(s)");
  }
}

void Engine::allocate() {
  const int rank = comm_.rank();
  const int stage = config_.stage;
  const DType compute = config_.compute_dtype;
  units_.clear();
  test_hooks::maybe_fail("finalize.alloc", rank);
  units_.resize(layout_.units.size());
  size_t largest_gathered = 0, largest_norm_blocks = 0;
  uint64_t global_offset = 0, element_base = 0;
  for (size_t u = 0; u < units_.size(); ++u) {
    const UnitLayout& ul = layout_.units[u];
    UnitState& us = units_[u];
    const size_t full = ul.padded_elems, shard = ul.shard_elems;
    us.persistent = stage == 3 && ul.used_elems < static_cast<size_t>(config_.param_persistence_threshold);
    us.full_params = !sharded_params(static_cast<int>(u));
    us.params.resize(us.full_params ? full : shard, compute);
    if (!us.full_params) largest_gathered = std::max(largest_gathered, full);
    us.grads.resize(stage <= 1 ? full : shard, config_.grad_accum_dtype);
    // Stage 0 updates the whole unit on every rank; the other stages update this rank's shard only.
    us.update_begin = stage == 0 ? 0 : rank * shard;
    us.update_elems = stage == 0 ? full : shard;
    if (separate_master()) us.master.resize(us.update_elems, DType::kF32);
    const int n_states = state_count(config_.optimizer);
    for (int s = 0; s < n_states; ++s) us.state[s].resize(us.update_elems, DType::kF32);
    us.global_offset = global_offset;
    global_offset += full;
    us.element_base = element_base;
    element_base += ul.used_elems;
    us.segments = layout_.segments(static_cast<int>(u), us.update_begin, us.update_elems, params_);
    us.norm_begin = rank * shard;
    us.norm_segments = layout_.segments(static_cast<int>(u), us.norm_begin, shard, params_);
    for (const ShardSegment& s : us.norm_segments)
      largest_norm_blocks = std::max(largest_norm_blocks, sum_squares_blocks(s.numel));
  }
  norm_scratch_.assign(largest_norm_blocks, 0.0);
  // One gathered unit and one gradient bucket at a time is the documented footprint; both are allocated now, so
  // that no collective allocates (a rank that cannot would leave the others waiting).
  gathered_pool_.set_capacity(largest_gathered, compute);
  if (largest_gathered > 0) gathered_pool_.reserve(1);
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
        bucket_states_[b].params_expected += layout_.units[u].params.size();
      }
    }
    bucket_pool_.set_capacity(largest_bucket, config_.grad_accum_dtype);
    bucket_pool_.reserve(1);
  }
  step_scalars_.resize(groups_.size());
}

// Rank 0's initial values reach every rank in fp32, in pieces of at most kInitialValuesChunk elements, so that no
// rank holds more than one extra piece however large a unit is, and the fp32 master starts exact even when the
// params train in bf16 or fp16.
void Engine::load_initial_values() {
  constexpr size_t kInitialValuesChunk = size_t{1} << 24;  // 64 MiB of fp32
  const int rank = comm_.rank();
  std::vector<float> staging;
  for (size_t u = 0; u < units_.size(); ++u) {
    const UnitLayout& ul = layout_.units[u];
    UnitState& us = units_[u];
    const size_t own = us.full_params ? 0 : rank * ul.shard_elems, own_end = own + us.params.size();
    for (size_t begin = 0; begin < ul.padded_elems; begin += kInitialValuesChunk) {
      const size_t end = std::min(ul.padded_elems, begin + kInitialValuesChunk);
      staging.assign(end - begin, 0.0f);
      if (rank == 0) {
        for (int p : ul.params) {
          const ParamPlacement& pl = layout_.params[p];
          const size_t lo = std::max(begin, pl.offset), hi = std::min(end, pl.offset + pl.numel);
          if (init_[p].data == nullptr || lo >= hi) continue;
          const char* src = static_cast<const char*>(init_[p].data) + (lo - pl.offset) * dtype_size(init_[p].dtype);
          convert(staging.data() + (lo - begin), DType::kF32, src, init_[p].dtype, hi - lo);
        }
      }
      comm_.broadcast(staging.data(), end - begin, ElemType::kF32, 0,
                      "zero_engine_finalize: rank 0's initial values of unit " + std::to_string(u) +
                          (end - begin < ul.padded_elems ? " from element " + std::to_string(begin) : ""));
      size_t lo = std::max(begin, own), hi = std::min(end, own_end);
      if (lo < hi)
        round_from_f32(us.params.at(lo - own), config_.compute_dtype, staging.data() + (lo - begin), hi - lo);
      lo = std::max(begin, us.update_begin), hi = std::min(end, us.update_begin + us.update_elems);
      if (separate_master() && lo < hi)
        std::memcpy(us.master.f32() + (lo - us.update_begin), staging.data() + (lo - begin), (hi - lo) * sizeof(float));
    }
  }
  init_.assign(init_.size(), ParamInit{});  // the caller's pointers are no longer needed, nor valid
}

// The fp32 values this rank updates: the separate master, or the params themselves when they are fp32.
float* Engine::master_of(int unit) {
  UnitState& us = units_[unit];
  if (separate_master()) return us.master.f32();
  return us.params.f32() + (us.full_params ? us.update_begin : 0);
}

// Where the optimizer writes the compute-dtype copy of what this rank updates (null when params are the master).
void* Engine::copy_of(int unit) {
  UnitState& us = units_[unit];
  if (!separate_master()) return nullptr;
  return us.params.at(us.full_params ? us.update_begin : 0);
}

// The reduced gradients of what this rank updates.
void* Engine::grads_of(int unit) {
  UnitState& us = units_[unit];
  return config_.stage <= 1 ? us.grads.at(us.update_begin) : us.grads.data();
}

CopyMode Engine::copy_mode() const {
  switch (config_.compute_dtype) {
    case DType::kBF16:
      return config_.stochastic_rounding ? CopyMode::kBf16Stochastic : CopyMode::kBf16Rne;
    case DType::kF16:
      return CopyMode::kFp16Rne;
    case DType::kF32:
      break;
  }
  return CopyMode::kNone;
}

void Engine::set_lr(int group, double lr) {
  const char* call = "zero_set_lr";
  if (aborted_.load() || state_ == State::kBroken) require_state(State::kReady, call);
  if (config_.scheduler.kind != SchedulerConfig::Kind::kNone)
    fail(ZERO_ERR_INVALID_STATE, "zero_set_lr: the config has a 'scheduler'; it sets the learning rate every step");
  if (!(lr >= 0.0 && lr < 1e6))  // the range zero_engine_add_param_group and the config accept
    fail(ZERO_ERR_INVALID_ARGUMENT, "zero_set_lr: lr must be in [0, 1e6), got " + exact_decimal(lr));
  if (group != -1 && (group < 0 || group >= static_cast<int>(groups_.size())))
    fail(ZERO_ERR_INVALID_ARGUMENT, "zero_set_lr: no param group " + std::to_string(group));
  for (int g = 0; g < static_cast<int>(groups_.size()); ++g)
    if (group == -1 || g == group) groups_[g].base_lr = lr;
}

MemoryStats Engine::memory_stats() const {
  MemoryStats s;
  for (const auto& us : units_) {
    s.param_bytes += us.params.n_bytes();
    s.grad_bytes += us.grads.n_bytes();
    s.master_param_bytes += us.master.n_bytes();
    s.optimizer_state_bytes += us.state[0].n_bytes() + us.state[1].n_bytes();
  }
  s.bucket_bytes = bucket_pool_.allocated_bytes();
  s.gathered_bytes = gathered_pool_.allocated_bytes();
  return s;
}

}  // namespace zero
