// The engine's calls, composed from its parts (engine.hpp); zero_step is in engine_step.cpp.
#include "engine/engine.hpp"

#include <algorithm>

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
      registration_(config_.optimizer),
      store_(comm_, guard_),
      reducer_(config_, comm_, guard_, store_),
      stepper_(config_, comm_.rank(), comm_.local_size()),
      checkpointer_(config_, comm_, guard_, registration_, store_, stepper_) {
  comm_.set_timeout(config_.timeout_s);
  // The plan of the stage before any unit exists: calls before finalize already know whether a gather would be
  // collective.
  store_.set_plan(Layout{}, make_plan(plan_spec(), Layout{}));
  for (const std::string& w : config_.warnings) log_message(ZERO_LOG_WARNING, comm_.rank(), w);
  if (!config_.no_effect_keys.empty()) {
    std::string keys;
    for (const auto& k : config_.no_effect_keys) keys += (keys.empty() ? "" : ", ") + k;
    log_message(ZERO_LOG_WARNING, comm_.rank(), "these config keys are valid but have no effect in libzero: " + keys);
  }
}

// The CPU engine keeps its model states in host memory; offload to "nvme" moves some of them to a file.
PlanSpec Engine::plan_spec() const {
  return plan_spec_for(config_, config_.stage, comm_.size(), comm_.rank(), MemorySpace::kHost);
}

void Engine::set_num_threads(int threads) {
  if (threads < 0 || threads > 4096)  // the range of libzero.optimizer_threads
    fail(ZERO_ERR_INVALID_ARGUMENT, "zero_engine_set_num_threads: threads must be in [0, 4096]");
  stepper_.set_threads(threads);
}

int Engine::add_param_group(const std::string& name, double lr, double weight_decay, double beta1, double beta2,
                            double eps) {
  guard_.require(CallGuard::State::kRegistering, "zero_engine_add_param_group");
  return registration_.add_group(name, lr, weight_decay, beta1, beta2, eps);
}

int Engine::add_param(ParamShape shape, ParamInit init) {
  guard_.require(CallGuard::State::kRegistering, "zero_engine_add_param");
  return registration_.add_param(std::move(shape), init);
}

void Engine::set_allocator(MemorySpace space, std::shared_ptr<Allocator> allocator) {
  guard_.require(CallGuard::State::kRegistering, "zero_engine_set_allocator");
  store_.allocators().set(space, std::move(allocator));
}

const ParamShape& Engine::param_shape(int param) const {
  registration_.check_param(param, "zero_param_info");
  return registration_.param(param);
}

UnitInfo Engine::unit_info(int unit) const {
  guard_.require(CallGuard::State::kReady, "zero_unit_info");
  store_.check_unit(unit, "zero_unit_info");
  return store_.unit_info(unit);
}

// ---------------------------------------------------------------------------------------------------------------
// Finalize: agree on the registration, plan and allocate, agree that every rank could, then move the initial
// values.

void Engine::finalize() {
  const char* call = "zero_engine_finalize";
  std::unique_ptr<Error> local = guard_.local_checks(call, [&] {
    guard_.require(CallGuard::State::kRegistering, call);
    if (config_.require_deterministic && !comm_.backend().capabilities().deterministic_sums)
      fail(ZERO_ERR_UNSUPPORTED,
           "zero_engine_finalize: the config asks for libzero.deterministic, but this communicator does not sum in "
           "rank order (a custom backend says it does with ZERO_COMM_DETERMINISTIC; MPI and single-process do)");
  });
  Layout layout;
  try {
    // Every call's first exchange is the same fixed-size agreement, so that a rank in another collective call
    // (zero_comm_finalize, say) meets one of the same size and both learn of the divergence; the registration
    // digests, a message of another size, come only after every rank is known to be here.
    guard_.agree(call, CallTag{CallKind::kFinalize, -1, 0, 0}, local.get());
    layout = registration_.agree_across_ranks(comm_, config_, nullptr);
  } catch (const Error& e) {
    if (comm_.failed()) guard_.broken(e);  // the exchange itself failed: the collective sequences are apart
    throw;
  }
  const size_t padded = layout.total_padded_elems();
  std::unique_ptr<Error> allocation_error;
  try {
    Plan plan = make_plan(plan_spec(), layout);
    store_.set_plan(std::move(layout), std::move(plan));
    io::AioSettings aio;
    aio.block_size = static_cast<size_t>(config_.offload.aio_block_size);
    aio.queue_depth = config_.offload.aio_queue_depth;
    store_.set_offload_target(config_.offload.nvme_path, aio);
    store_.set_param_offload_target(config_.offload.param_nvme_path);
    store_.allocate(registration_.params());
    FetchPolicy fetch;
    fetch.background_publish = config_.overlap_comm;
    fetch.prefetch_elements = config_.prefetch_bucket_size;
    fetch.max_live_elements = config_.max_live_parameters;
    fetch.max_reuse_distance = config_.max_reuse_distance;
    store_.set_fetch_policy(fetch);
    store_.set_next_micro_step_in_window(config_.gradient_accumulation_steps > 1);
    reducer_.allocate(registration_.num_params());
    stepper_.allocate(store_, registration_.groups().size());
    // zero_memory_stats reports the plan: what was allocated must be exactly that.
    if (!(store_.allocated_bytes(reducer_.bucket_bytes()) == memory_stats()))
      fail(ZERO_ERR_INTERNAL, "zero_engine_finalize: the buffers allocated differ from the placement plan");
  } catch (const Error& e) {
    allocation_error = std::make_unique<Error>(e);
  } catch (const std::bad_alloc&) {
    allocation_error = std::make_unique<Error>(ZERO_ERR_OUT_OF_MEMORY,
                                               std::string(call) + ": out of memory allocating this rank's buffers (" +
                                                   std::to_string(padded) + " padded elements)");
  }
  auto clear = [&] {  // nothing allocated, nothing planned: as before finalize, which may be retried
    store_.clear();
    reducer_.clear();
    store_.set_plan(Layout{}, make_plan(plan_spec(), Layout{}));
  };
  if (allocation_error) clear();
  try {
    guard_.agree(call, CallTag{CallKind::kFinalize, 0, static_cast<int64_t>(padded), 0}, allocation_error.get());
  } catch (const Error&) {
    if (!allocation_error) clear();
    throw;
  }
  if (config_.offload.nvme() && !store_.offloaded() && comm_.rank() == 0)
    log_message(ZERO_LOG_WARNING, 0,
                "offload_optimizer to NVMe: nothing to offload (fp32 params are their own master, and " +
                    std::string(optimizer_name(config_.optimizer.kind)) +
                    " keeps no state here): no file is created under '" + config_.offload.nvme_path + "'");
  if (config_.offload.params_nvme() && !store_.plan().param_offload.enabled && comm_.rank() == 0)
    log_message(ZERO_LOG_WARNING, 0,
                "offload_param to NVMe: every unit stays resident (each is smaller than "
                "stage3_param_persistence_threshold = " +
                    std::to_string(config_.param_persistence_threshold) + " elements): no param file is created");
  guard_.moving_data([&] { store_.load_initial_values(registration_, config_.compute_dtype); });
  registration_.forget_initial_values();
  guard_.set_ready();
  if (comm_.rank() == 0 && log_enabled(ZERO_LOG_INFO)) {
    const MemoryStats m = memory_stats();
    log_message(ZERO_LOG_INFO, 0,
                "zero_engine_finalize: " + store_.plan().describe() + "; " +
                    std::to_string(registration_.num_params()) + " params in " + std::to_string(store_.num_units()) +
                    " units (" + std::to_string(padded) + " padded elements); rank 0 holds " + mib(m.total()) +
                    ": params " + mib(m.param_bytes) + ", gradients " + mib(m.grad_bytes) + ", fp32 master " +
                    mib(m.master_param_bytes) + ", optimizer state " + mib(m.optimizer_state_bytes) + ", buckets " +
                    mib(m.bucket_bytes) + ", gathered units " + mib(m.gathered_bytes) + "; optimizer on the " +
                    isa_name(stepper_.isa()) + " path with " + std::to_string(stepper_.threads()) + " thread(s)");
  }
}

// ---------------------------------------------------------------------------------------------------------------
// The micro-step: params and gradients of the framework's forward and backward passes.

void Engine::check_window(const char* call) const {
  if (micro_steps_ == config_.gradient_accumulation_steps)
    fail(ZERO_ERR_INVALID_STATE, std::string(call) + ": gradient_accumulation_steps (" +
                                     std::to_string(config_.gradient_accumulation_steps) +
                                     ") micro-steps are complete; call zero_step first");
}

void* Engine::param_data(int param) {
  guard_.require(CallGuard::State::kReady, "zero_param_data");
  registration_.check_param(param, "zero_param_data");
  const ParamPlacement& pl = store_.layout().params[param];
  void* unit = store_.gathered(pl.unit);
  // The same rule for every unit, so that code written against a small model or a low stage keeps working when
  // units grow past the persistence threshold or the stage changes.
  if (unit == nullptr)
    fail(ZERO_ERR_INVALID_STATE, "zero_param_data: param '" + registration_.param(param).name + "' lives in " +
                                     unit_name(pl.unit) + ", which is not gathered; call zero_gather(engine, " +
                                     std::to_string(pl.unit) + ") first (at every stage: it is free below stage 3)");
  return static_cast<char*>(unit) + pl.offset * dtype_size(config_.compute_dtype);
}

void* Engine::grad_data(int param) {
  guard_.require(CallGuard::State::kReady, "zero_grad_data");
  registration_.check_param(param, "zero_grad_data");
  check_window("zero_grad_data");
  return reducer_.grad_buffer(param, registration_.param(param).name);
}

Engine::~Engine() {
  if (!guard_.ready() || comm_.failed() || guard_.aborted() || comm_.backend().aborted() || comm_.backend().finalized())
    return;
  try {
    store_.drain(std::min(5.0, comm_.timeout()));
  } catch (...) {  // a destructor: whatever is left stays in flight, its buffers never freed
  }
}

void Engine::gather(int unit) { store_.gather(unit, "zero_gather"); }

void Engine::release(int unit) { store_.release(unit, "zero_release"); }

void Engine::prefetch(int unit) { store_.prefetch(unit, "zero_prefetch"); }

void Engine::grad_ready(int param) {
  const char* call = "zero_grad_ready";
  guard_.require(CallGuard::State::kReady, call);
  registration_.check_param(param, call);
  check_window(call);
  if (reducer_.declared_ready(param))
    fail(ZERO_ERR_INVALID_STATE,
         "zero_grad_ready: '" + registration_.param(param).name + "' was already declared ready in this micro-step");
  reducer_.grad_ready(param, call);
}

void Engine::backward_end() {
  const char* call = "zero_backward_end";
  // A rank whose call is wrong (too many micro-steps, not finalized) still joins the agreement, so the others hear
  // of it.
  std::unique_ptr<Error> local = guard_.local_checks(call, [&] {
    guard_.require(CallGuard::State::kReady, call);
    check_window(call);
    test_hooks::maybe_fail("backward_end", comm_.rank());
  });
  if (!local) reducer_.reduce_remaining(call);
  guard_.agree(call, CallTag{CallKind::kBackwardEnd, micro_step_count_ + 1, 0, 0}, local.get());
  reducer_.finish_micro_step(call);
  store_.end_micro_step();
  micro_steps_ += 1;
  store_.set_next_micro_step_in_window(micro_steps_ + 1 < config_.gradient_accumulation_steps);
  reducer_.set_micro_step_in_window(micro_steps_);
  micro_step_count_ += 1;
}

void Engine::set_lr(int group, double lr) {
  const char* call = "zero_set_lr";
  if (guard_.aborted() || guard_.state() == CallGuard::State::kBroken) guard_.require(CallGuard::State::kReady, call);
  if (config_.scheduler.kind != SchedulerConfig::Kind::kNone)
    fail(ZERO_ERR_INVALID_STATE, "zero_set_lr: the config has a 'scheduler'; it sets the learning rate every step");
  if (!(lr >= 0.0 && lr < 1e6))  // the range zero_engine_add_param_group and the config accept
    fail(ZERO_ERR_INVALID_ARGUMENT, "zero_set_lr: lr must be in [0, 1e6), got " + exact_decimal(lr));
  if (group != -1 && (group < 0 || group >= static_cast<int>(registration_.groups().size())))
    fail(ZERO_ERR_INVALID_ARGUMENT, "zero_set_lr: no param group " + std::to_string(group));
  registration_.set_base_lr(group, lr);
}

// A checkpoint reads the params and a load writes them: the all-gathers started ahead complete first (every rank
// started them, so every rank completes them, whatever its checkpoint call then finds), and what was fetched
// ahead or kept is given back on every rank (a load changes the params; a save's gathers must not leave ranks
// with different units kept). Unconditional: whether fetches are still in flight differs between ranks (a rank
// completes a resident unit's publish in its own zero_gather), what settle() leaves behind does not.
void Engine::settle_fetches() {
  if (guard_.ready()) guard_.moving_data([&] { store_.settle(); });
}

void Engine::save_checkpoint(const std::string& dir, const std::string& tag) {
  settle_fetches();
  checkpointer_.save(dir, tag, micro_steps_, reducer_.micro_step_begun());
  settle_fetches();  // what the consolidated weights' gathers fetched ahead or kept, and their place in the order
}

void Engine::load_checkpoint(const std::string& dir, const std::string& tag) {
  settle_fetches();
  checkpointer_.load(dir, tag, micro_steps_, reducer_.micro_step_begun());
  reducer_.start_window();  // the load cleared every accumulator
  reducer_.set_micro_step_in_window(micro_steps_);
  store_.set_next_micro_step_in_window(micro_steps_ + 1 < config_.gradient_accumulation_steps);
}

}  // namespace zero
