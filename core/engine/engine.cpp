// The engine's calls, composed from its parts (engine.hpp); zero_step is in engine_step.cpp. Every call opens a
// CallScope first: the parts it goes through name their errors and collectives after it.
#include "engine/engine.hpp"

#include <algorithm>
#include <cstring>

#include "engine/device_call.hpp"
#include "engine/host_staging.hpp"
#include "plan/plan_spec.hpp"
#include "util/error.hpp"
#include "util/log.hpp"
#include "util/test_hooks.hpp"

namespace zero {
namespace {

std::string unit_name(int unit) { return "unit " + std::to_string(unit); }

std::string mib(uint64_t bytes) { return std::to_string((bytes + (1 << 19)) >> 20) + " MiB"; }

}  // namespace

Engine::Engine(Config config, std::shared_ptr<Communicator> comm)
    : config_(std::move(config)),
      comm_(std::move(comm)),
      guard_(comm_),
      window_(config_.gradient_accumulation_steps),
      registration_(config_.optimizer),
      store_(comm_, guard_, window_),
      reducer_(config_, comm_, guard_, store_, window_),
      stepper_(config_, comm_.rank(), comm_.local_size()),
      checkpointer_(config_, comm_, guard_, registration_, store_, stepper_, window_) {
  comm_.set_timeout(config_.timeout_s);
  comm_.set_any_order(config_.allow_any_order);
  // The plan of the stage before any unit exists: calls before finalize already know whether a gather would be
  // collective.
  store_.set_plan(Layout{}, make_plan(plan_spec(), Layout{}));
  for (const std::string& w : config_.warnings) log_message(ZERO_LOG_WARNING, comm_.rank(), w);
  warn_no_effect_keys(false);
}

// Offload to "cpu" (and its pin_memory) has an effect only on a device engine (ZeRO-Offload), the CPU engine's state
// being in host memory already: those keys are named at finalize, once the engine knows where it runs; the others
// at once.
void Engine::warn_no_effect_keys(bool at_finalize) const {
  std::string keys;
  for (const auto& k : config_.no_effect_keys) {
    const bool offload_to_cpu =
        k == "zero_optimization.offload_optimizer.device" || k == "zero_optimization.offload_optimizer.pin_memory" ||
        k == "zero_optimization.offload_param.device" || k == "zero_optimization.offload_param.pin_memory";
    if (offload_to_cpu != at_finalize || (at_finalize && device_)) continue;
    keys += (keys.empty() ? "" : ", ") + k;
  }
  if (!keys.empty())
    log_message(ZERO_LOG_WARNING, comm_.rank(), "these config keys are valid but have no effect in libzero: " + keys);
}

// The CPU engine keeps its model states in host memory, a device engine in device memory; offload to "nvme" moves
// some of them to a file.
PlanSpec Engine::plan_spec() const {
  return plan_spec_for(config_, config_.stage, comm_.size(), comm_.rank(),
                       device_ ? MemorySpace::kDevice : MemorySpace::kHost);
}

void Engine::set_device(std::shared_ptr<device::Runtime> runtime) {
  CallScope scope(guard_, "zero_engine_set_device");
  guard_.require(CallGuard::State::kRegistering);
  if (runtime == nullptr) guard_.fail(ZERO_ERR_INVALID_ARGUMENT, "no device runtime");
  // Device memory's operations are the process's (one context): a second device engine alive beside the first
  // would run the first's on its own stream, unordered with the first's work.
  const std::shared_ptr<device::DeviceContext> installed = device::installed_device_memory();
  if (installed != nullptr && installed != device_)
    guard_.fail(ZERO_ERR_UNSUPPORTED,
                "another device engine of this process is alive: one device engine per process "
                "at a time so far (destroy the other first)");
  device_ = std::make_shared<device::DeviceContext>(std::move(runtime), config_.timeout_s);
  comm_.set_data_in_device_memory(true);
  comm_.set_data_staging(std::make_shared<device::PinnedStaging>(device_));
  comm_.set_data_queue(device_->runtime().native(device_->stream()));
  device::install_device_memory(device_);
  device::install_allocators(store_.allocators(), device_);
  stepper_.use_device(device_);
  store_.set_plan(Layout{}, make_plan(plan_spec(), Layout{}));
}

void Engine::set_stream(void* stream) {
  CallScope scope(guard_, "zero_engine_set_stream");
  if (!device_)
    guard_.fail(ZERO_ERR_INVALID_STATE, "the engine has no device (zero_engine_set_device first): no stream to order");
  framework_stream_ = device_->runtime().external_stream(stream);
  if (!call_begin_) call_begin_ = device_->runtime().create_event();
  if (!call_end_) call_end_ = device_->runtime().create_event();
}

std::pair<int32_t, int32_t> Engine::dlpack_device() const {
  if (!device_) return {1, 0};
  if (device_->runtime().emulated()) return {12, 0};
  return {2, device_->runtime().ordinal()};
}

void Engine::order_stream(void* stream) {
  CallScope scope(guard_, "zero_engine_order_stream");
  if (!device_)
    guard_.fail(ZERO_ERR_INVALID_STATE, "the engine has no device (zero_engine_set_device first): no stream to order");
  device::Runtime& rt = device_->runtime();
  const std::unique_ptr<device::Stream> consumer = rt.external_stream(stream);
  if (!handed_over_) handed_over_ = rt.create_event();
  rt.record(*handed_over_, device_->stream());
  rt.wait(*consumer, *handed_over_);
}

void Engine::copy(void* dst, const void* src, size_t bytes) {
  CallScope scope(guard_, "zero_engine_copy");
  if (ranges_overlap(dst, bytes, src, bytes)) guard_.fail(ZERO_ERR_INVALID_ARGUMENT, "the ranges overlap");
  if (!device_) {
    if (bytes != 0) std::memcpy(dst, src, bytes);
    return;
  }
  DeviceCall device_call(*this);
  device_->runtime().copy(dst, src, bytes, device_->stream());
  device_->finish("a copy to or from the engine's device memory");
  device_call.end("zero_engine_copy");
}

// What the device engine does not run yet: refused at finalize, on the rank that has it, before anything moves.
void Engine::check_device_config() const {
  const bool device_buffers = comm_.size() > 1 && comm_.backend().capabilities().device_buffers;
  if (!device_) {
    if (device_buffers)
      guard_.fail(ZERO_ERR_UNSUPPORTED,
                  "the communicator's data collectives take device memory (NCCL), and this engine keeps its data in "
                  "host memory: give it a device (zero_engine_set_device) or a host communicator");
    return;
  }
  const std::string on = "the device engine (" + device_->runtime().describe() + ")";
  if (device_buffers && device_->runtime().emulated())
    guard_.fail(ZERO_ERR_UNSUPPORTED, on + "'s memory is not a device's: a communicator that takes device buffers "
                                           "(NCCL) needs a CUDA device; over a host communicator the emulator's "
                                           "collectives are staged through host memory");
  if (comm_.size() > 1 && !comm_.host_staged() && !device_buffers)
    guard_.fail(ZERO_ERR_INTERNAL, on + " at more than one rank has neither a device communicator nor host staging");
  if (model_parallel_ != nullptr) guard_.fail(ZERO_ERR_UNSUPPORTED, on + " runs without a model-parallel group so far");
  if (config_.offload.nvme() || config_.offload.params_nvme())
    guard_.fail(ZERO_ERR_UNSUPPORTED,
                on + " offloads to \"cpu\" only so far (offload to \"nvme\" is not built for it)");
  if (config_.stage == 0 && config_.offload.optimizer == OffloadConfig::Device::kCpu)
    guard_.fail(ZERO_ERR_CONFIG,
                "offload_optimizer \"cpu\" needs ZeRO stage 1, 2 or 3 (stage 0 updates every element "
                "on every rank, on the device)");
}

void Engine::set_num_threads(int threads) {
  if (threads < 0 || threads > 4096)  // the range of libzero.optimizer_threads
    fail(ZERO_ERR_INVALID_ARGUMENT, "zero_engine_set_num_threads: threads must be in [0, 4096]");
  stepper_.set_threads(threads);
}

int Engine::add_param_group(const std::string& name, double lr, double weight_decay, double beta1, double beta2,
                            double eps) {
  CallScope scope(guard_, "zero_engine_add_param_group");
  guard_.require(CallGuard::State::kRegistering);
  return registration_.add_group(name, lr, weight_decay, beta1, beta2, eps);
}

int Engine::add_param(ParamShape shape, ParamInit init) {
  CallScope scope(guard_, "zero_engine_add_param");
  guard_.require(CallGuard::State::kRegistering);
  return registration_.add_param(std::move(shape), init);
}

void Engine::set_allocator(MemorySpace space, std::shared_ptr<Allocator> allocator) {
  CallScope scope(guard_, "zero_engine_set_allocator");
  guard_.require(CallGuard::State::kRegistering);
  store_.allocators().set(space, std::move(allocator));
}

void Engine::set_model_parallel(std::shared_ptr<Communicator> group) {
  CallScope scope(guard_, "zero_engine_set_model_parallel");
  guard_.require(CallGuard::State::kRegistering);
  if (group != nullptr && group.get() == &comm_.backend())
    guard_.fail(ZERO_ERR_INVALID_ARGUMENT,
                "mp_comm is the engine's own communicator, its data-parallel group; the model-parallel group is "
                "another one (the ranks that hold the other parts of this rank's model replica)");
  if (group != nullptr && group->finalized())
    guard_.fail(ZERO_ERR_INVALID_STATE, "mp_comm was finalized (zero_comm_finalize)");
  if (group != nullptr && group->aborted())
    guard_.fail(ZERO_ERR_ABORTED, "mp_comm was aborted (" + group->abort_reason() + ")");
  guard_.set_model_parallel(nullptr);
  model_parallel_.reset();
  if (group == nullptr || group->size() == 1) return;
  model_parallel_ = std::make_unique<EngineComm>(std::move(group));
  model_parallel_->set_timeout(comm_.timeout());
  model_parallel_->set_rank_name("model-parallel rank");
  guard_.set_model_parallel(model_parallel_.get());
}

double Engine::sum_over_job(double local, const std::string& what) {
  if (model_parallel_ != nullptr) {
    test_hooks::maybe_fail("step.model_parallel", comm_.rank());
    local = model_parallel_->sum_over_ranks(local, guard_.label(what + " over the model-parallel group"));
  }
  return comm_.sum_over_ranks(local, guard_.label(what));
}

void Engine::check_param(int param) const {
  const std::string problem = registration_.unknown_param(param);
  if (!problem.empty()) guard_.fail(ZERO_ERR_INVALID_ARGUMENT, problem);
}

const ParamShape& Engine::param_shape(int param) const {
  CallScope scope(guard_, "zero_param_info");
  check_param(param);
  return registration_.param(param);
}

MemoryStats Engine::memory_report() const {
  CallScope scope(guard_, "zero_memory_stats");
  return planned_memory();
}

MemoryStats Engine::placement_report() const {
  CallScope scope(guard_, "zero_memory_placement");
  return planned_memory();
}

MemoryStats Engine::planned_memory() const {
  if (guard_.state() == CallGuard::State::kRegistering)
    guard_.fail(ZERO_ERR_INVALID_STATE,
                "needs zero_engine_finalize first (it plans and allocates the buffers this reports)");
  return memory_stats();
}

UnitInfo Engine::unit_info(int unit) const {
  CallScope scope(guard_, "zero_unit_info");
  guard_.require(CallGuard::State::kReady);
  store_.check_unit(unit);
  return store_.unit_info(unit);
}

// ---------------------------------------------------------------------------------------------------------------
// Finalize: agree on the registration, plan and allocate, agree that every rank could, then move the initial
// values.

void Engine::finalize() {
  CallScope scope(guard_, "zero_engine_finalize");
  Layout layout;
  {
    // Every call's first exchange is the same fixed-size agreement, so that a rank in another collective call
    // (zero_comm_finalize, say) meets one of the same size and both learn of the divergence; the registration
    // digests, a message of another size, come only after every rank is known to be here.
    CollectiveCall arrival(guard_, CallKind::kFinalize);
    arrival.check([&] {
      guard_.require(CallGuard::State::kRegistering);
      check_device_config();
      if (config_.require_deterministic && !comm_.backend().capabilities().deterministic_sums)
        guard_.fail(ZERO_ERR_UNSUPPORTED,
                    "the config asks for libzero.deterministic, but this communicator does not sum in rank order (a "
                    "custom backend says it does with ZERO_COMM_DETERMINISTIC; MPI and single-process do)");
    });
    // A rank without the model-parallel group its data-parallel peers have would wait in no exchange of theirs:
    // the group's size is part of the arrival, so the peers all fail here, before any model-parallel exchange.
    const int64_t mp_size = model_parallel_size();
    auto explain_groups = [&](EngineComm& ranks) {
      std::vector<int64_t> sizes(static_cast<size_t>(ranks.size()));
      sizes[static_cast<size_t>(ranks.rank())] = mp_size;
      ranks.control_all_gather(sizes.data(), sizeof(int64_t), guard_.label("the ranks' model-parallel groups"));
      std::string text =
          "the ranks have different model-parallel groups (zero_engine_set_model_parallel; every rank of the job "
          "calls it, a data-parallel group's ranks with groups of one size):";
      for (int r = 0; r < ranks.size(); ++r)
        text += std::string(r ? "," : "") + " " + ranks.rank_name() + " " + std::to_string(r) + " " +
                (sizes[r] == 1 ? std::string("none") : "size " + std::to_string(sizes[r]));
      return text;
    };
    try {
      arrival.agree(-1, 0, mp_size, explain_groups);
      // The data-parallel group's registration, then the model-parallel group's settings; an error of the first
      // reaches the second's ranks through its exchange.
      std::unique_ptr<Error> data_parallel_error;
      try {
        layout = registration_.agree_across_ranks(comm_, config_, nullptr);
      } catch (const Error& e) {
        if (comm_.failed() || model_parallel_ == nullptr) throw;
        data_parallel_error = std::make_unique<Error>(e);
      }
      if (model_parallel_ != nullptr)
        registration_.agree_across_model_parallel(*model_parallel_, config_, comm_.size(), comm_.rank(),
                                                  data_parallel_error.get());
    } catch (const Error& e) {
      // The exchange itself failed: the collective sequences are apart.
      if (comm_.failed() || (model_parallel_ != nullptr && model_parallel_->failed())) guard_.broken(e);
      throw;
    }
  }
  const size_t padded = layout.total_padded_elems();
  CollectiveCall allocation(guard_, CallKind::kFinalize);
  allocation.check_failed(capture_error(
      guard_.call(),
      [&] {
        Plan plan = make_plan(plan_spec(), layout);
        store_.set_plan(std::move(layout), std::move(plan));
        io::AioSettings aio;
        aio.block_size = static_cast<size_t>(config_.offload.aio_block_size);
        aio.queue_depth = config_.offload.aio_queue_depth;
        store_.set_offload_targets(config_.offload.nvme_path, config_.offload.param_nvme_path, aio);
        NormSettings norm;
        norm.needed_first = config_.skip_nonfinite_steps || config_.gradient_clipping > 0.0;
        norm.widened = dtype_size(config_.comm_dtype) < dtype_size(config_.grad_accum_dtype);
        norm.leave_out_duplicates = model_parallel_ != nullptr;
        norm.on_device = device_ != nullptr;
        store_.allocate(registration_.params(), norm);
        if (device_ && config_.offload.optimizer == OffloadConfig::Device::kCpu) {
          OffloadBuffers slots;
          slots.grad_slot_bytes = store_.offload_grad_staging_bytes() / 2;
          slots.param_slot_bytes = store_.offload_param_staging_bytes() / 2;
          for (size_t i = 0; i < 2; ++i) {
            slots.grad_slots[i] = static_cast<char*>(store_.offload_grad_staging()) + i * slots.grad_slot_bytes;
            slots.param_slots[i] = slots.param_slot_bytes == 0 ? nullptr
                                                               : static_cast<char*>(store_.offload_param_staging()) +
                                                                     i * slots.param_slot_bytes;
          }
          offload_ = std::make_unique<device::OffloadTransfers>(device_, slots);
          reducer_.set_offload(&offload_->pipeline());
          stepper_.set_offload(&offload_->pipeline());
        }
        FetchPolicy fetch;
        fetch.background_publish = config_.overlap_comm;
        fetch.prefetch_elements = config_.prefetch_bucket_size;
        fetch.max_live_elements = config_.max_live_parameters;
        fetch.max_reuse_distance = config_.max_reuse_distance;
        store_.set_fetch_policy(fetch);
        reducer_.allocate(registration_.num_params());
        stepper_.allocate(store_, registration_.groups().size());
        // zero_memory_stats reports the plan: what was allocated must be exactly that.
        if (!(store_.allocated_bytes(reducer_.bucket_bytes()) == memory_stats()))
          guard_.fail(ZERO_ERR_INTERNAL, "the buffers allocated differ from the placement plan");
      },
      "out of memory allocating this rank's buffers (" + std::to_string(padded) + " padded elements)"));
  auto clear = [&] {  // nothing allocated, nothing planned: as before finalize, which may be retried
    reducer_.clear();
    reducer_.set_offload(nullptr);
    stepper_.set_offload(nullptr);
    offload_.reset();
    store_.clear();
    store_.set_plan(Layout{}, make_plan(plan_spec(), Layout{}));
  };
  if (allocation.failed()) clear();
  try {
    allocation.agree(0, static_cast<int64_t>(padded));
  } catch (const Error&) {
    if (!allocation.failed()) clear();
    throw;
  }
  if (config_.offload.nvme() && !store_.optimizer_on_nvme() && comm_.rank() == 0)
    log_message(ZERO_LOG_WARNING, 0,
                "offload_optimizer to NVMe: nothing to offload (fp32 params are their own master, and " +
                    std::string(optimizer_name(config_.optimizer.kind)) +
                    " keeps no state here): no file is created under '" + config_.offload.nvme_path + "'");
  if (config_.offload.params_nvme() && !store_.plan().nvme_params.enabled && comm_.rank() == 0)
    log_message(ZERO_LOG_WARNING, 0,
                "offload_param to NVMe: every unit stays resident (each is smaller than "
                "stage3_param_persistence_threshold = " +
                    std::to_string(config_.param_persistence_threshold) + " elements): no param file is created");
  allocation.move([&] { store_.load_initial_values(registration_, config_.compute_dtype); });
  registration_.forget_initial_values();
  if (device_) device_->finish("zero_engine_finalize's device work");  // the params are there for any stream
  guard_.set_ready();
  warn_no_effect_keys(true);
  if (comm_.rank() == 0 && log_enabled(ZERO_LOG_INFO)) {
    const MemoryStats m = memory_stats();
    log_message(
        ZERO_LOG_INFO, 0,
        guard_.label(store_.plan().describe() + "; " + std::to_string(registration_.num_params()) + " params in " +
                     std::to_string(store_.num_units()) + " units (" + std::to_string(padded) +
                     " padded elements); rank 0 holds " + mib(m.total()) + ": params " + mib(m.param_bytes) +
                     ", gradients " + mib(m.grad_bytes) + ", fp32 master " + mib(m.master_param_bytes) +
                     ", optimizer state " + mib(m.optimizer_state_bytes) + ", buckets " + mib(m.bucket_bytes) +
                     ", gathered units " + mib(m.gathered_bytes) + "; optimizer on the " + isa_name(stepper_.isa()) +
                     " path with " + std::to_string(stepper_.threads()) + " thread(s)"));
  }
}

// ---------------------------------------------------------------------------------------------------------------
// The micro-step: params and gradients of the framework's forward and backward passes.

void Engine::check_window() const {
  if (window_.complete())
    guard_.fail(ZERO_ERR_INVALID_STATE, "gradient_accumulation_steps (" +
                                            std::to_string(config_.gradient_accumulation_steps) +
                                            ") micro-steps are complete; call zero_step first");
}

void* Engine::param_data(int param) {
  CallScope scope(guard_, "zero_param_data");
  guard_.require(CallGuard::State::kReady);
  check_param(param);
  const ParamPlacement& pl = store_.layout().params[param];
  // The same rule for every unit, so that code written against a small model or a low stage keeps working when
  // units grow past the persistence threshold or the stage changes.
  if (!store_.unit(pl.unit).gathered())
    guard_.fail(ZERO_ERR_INVALID_STATE, "param '" + registration_.param(param).name + "' lives in " +
                                            unit_name(pl.unit) + ", which is not gathered; call zero_gather(engine, " +
                                            std::to_string(pl.unit) +
                                            ") first (at every stage: it is free below stage 3)");
  if (pl.frozen) return static_cast<char*>(store_.gathered_frozen(pl.unit)) + pl.offset;
  return static_cast<char*>(store_.gathered(pl.unit)) + pl.offset * dtype_size(config_.compute_dtype);
}

void Engine::check_trained(int param) const {
  if (registration_.param(param).frozen)
    guard_.fail(ZERO_ERR_INVALID_ARGUMENT,
                "param '" + registration_.param(param).name + "' is frozen (ZERO_PARAM_FROZEN): it has no gradient");
}

void* Engine::grad_data(int param) {
  CallScope scope(guard_, "zero_grad_data");
  guard_.require(CallGuard::State::kReady);
  check_param(param);
  check_trained(param);
  check_window();
  DeviceCall device_call(*this);
  void* buffer = reducer_.grad_buffer(param, registration_.param(param).name);
  device_call.end("zero_grad_data");
  return buffer;
}

Engine::~Engine() {
  // ZeRO-Offload's copies end before what they touch is freed; one that stopped may still read or write the slots,
  // the buckets and the device params: they outlive the engine.
  if (offload_) {
    try {
      offload_->pipeline().drop_gradients();
      offload_->pipeline().finish_params();
    } catch (...) {  // a destructor: the failure was a call's error already
    }
    if (offload_->failed()) store_.leak();
  }
  if (device_ && framework_stream_) {
    // The framework's work queued so far may still read the params or write the gradients: the frees below are
    // ordered on the engine's stream after it.
    try {
      device_->runtime().record(*call_begin_, *framework_stream_);
      device_->runtime().wait(device_->stream(), *call_begin_);
    } catch (...) {  // a device that failed keeps what it holds
    }
  }
  if (!guard_.ready() || comm_.failed() || guard_.aborted() || comm_.backend().aborted() || comm_.finalized()) return;
  try {
    store_.drain(std::min(5.0, comm_.timeout()));
  } catch (...) {  // a destructor: whatever is left stays in flight, its buffers never freed
  }
}

void Engine::gather(int unit) {
  CallScope scope(guard_, "zero_gather");
  DeviceCall device_call(*this);
  store_.gather(unit);
  device_call.end("zero_gather");
}

void Engine::release(int unit) {
  CallScope scope(guard_, "zero_release");
  DeviceCall device_call(*this);
  store_.release(unit);
  device_call.end("zero_release");
}

void Engine::release_modified(int unit, int modifier_rank) {
  CallScope scope(guard_, "zero_release_modified");
  DeviceCall device_call(*this);
  store_.release_modified(unit, modifier_rank, reducer_.micro_step_begun());
  device_call.end("zero_release_modified");
}

void Engine::prefetch(int unit) {
  CallScope scope(guard_, "zero_prefetch");
  DeviceCall device_call(*this);
  store_.prefetch(unit);
  device_call.end("zero_prefetch");
}

void Engine::grad_ready(int param) {
  CallScope scope(guard_, "zero_grad_ready");
  guard_.require(CallGuard::State::kReady);
  check_param(param);
  check_trained(param);
  check_window();
  if (reducer_.declared_ready(param))
    guard_.fail(ZERO_ERR_INVALID_STATE,
                "'" + registration_.param(param).name + "' was already declared ready in this micro-step");
  DeviceCall device_call(*this);
  reducer_.grad_ready(param);
  device_call.end("zero_grad_ready");
}

void Engine::backward_end() {
  CallScope scope(guard_, "zero_backward_end");
  // A rank whose call is wrong (too many micro-steps, not finalized) still joins the agreement, so the others hear
  // of it. The buckets still pending reduce first, each with its own agreement.
  CollectiveCall call(guard_, CallKind::kBackwardEnd);
  call.check([&] {
    guard_.require(CallGuard::State::kReady);
    check_window();
    test_hooks::maybe_fail("backward_end", comm_.rank());
  });
  DeviceCall device_call(*this);
  if (!call.failed()) reducer_.reduce_remaining();
  call.agree(window_.total_ended() + 1);
  reducer_.finish_micro_step();
  store_.end_micro_step();
  window_.end_micro_step();
  device_call.end("zero_backward_end");
}

void Engine::set_lr(int group, double lr) {
  CallScope scope(guard_, "zero_set_lr");
  if (guard_.aborted() || guard_.state() == CallGuard::State::kBroken) guard_.require(CallGuard::State::kReady);
  if (config_.scheduler.kind != SchedulerConfig::Kind::kNone)
    guard_.fail(ZERO_ERR_INVALID_STATE, "the config has a 'scheduler'; it sets the learning rate every step");
  if (!(lr >= 0.0 && lr < 1e6))  // the range zero_engine_add_param_group and the config accept
    guard_.fail(ZERO_ERR_INVALID_ARGUMENT, "lr must be in [0, 1e6), got " + exact_decimal(lr));
  if (group != -1 && (group < 0 || group >= static_cast<int>(registration_.groups().size())))
    guard_.fail(ZERO_ERR_INVALID_ARGUMENT, "no param group " + std::to_string(group));
  registration_.set_base_lr(group, lr);
}

double Engine::next_lr(int group) const {
  if (guard_.state() == CallGuard::State::kRegistering)
    fail(ZERO_ERR_INVALID_STATE, "zero_get_lr: call zero_engine_finalize first");
  if (group < 0 || group >= static_cast<int>(registration_.groups().size()))
    fail(ZERO_ERR_INVALID_ARGUMENT, "zero_get_lr: no param group " + std::to_string(group));
  return stepper_.next_lr(registration_.groups()[static_cast<size_t>(group)].base_lr);
}

// A checkpoint reads the params and a load writes them: the all-gathers started ahead complete first (every rank
// started them, so every rank completes them, whatever its checkpoint call then finds), and what was fetched
// ahead or kept is given back on every rank (a load changes the params; a save's gathers must not leave ranks
// with different units kept). Unconditional: whether fetches are still in flight differs between ranks (a rank
// completes a resident unit's publish in its own zero_gather), what settle() leaves behind does not.
void Engine::settle_fetches() {
  if (guard_.ready()) guard_.moving_data([&] { store_.settle(); });
}

void Engine::save_checkpoint(const std::string& dir, const std::string& tag, bool exclude_frozen) {
  CallScope scope(guard_, "zero_save_checkpoint");
  DeviceCall device_call(*this);
  settle_fetches();
  checkpointer_.save(dir, tag, reducer_.micro_step_begun(), exclude_frozen);
  settle_fetches();  // what the consolidated weights' gathers fetched ahead or kept, and their place in the order
  device_call.end("zero_save_checkpoint");
}

void Engine::load_checkpoint(const std::string& dir, const std::string& tag) {
  CallScope scope(guard_, "zero_load_checkpoint");
  DeviceCall device_call(*this);
  settle_fetches();
  checkpointer_.load(dir, tag, reducer_.micro_step_begun());
  reducer_.after_load();  // the load cleared every gradient: a new window
  device_call.end("zero_load_checkpoint");
}

}  // namespace zero
