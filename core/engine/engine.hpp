// The ZeRO engine of one rank: the C API's calls, composed from parts that each own one thing
// (docs/architecture.md, "The engine's parts"):
//   Registration     params, groups, initial values; finalize's cross-rank agreement   (params/registration.*)
//   ParameterStore   layout, placement plan, every buffer; gather, release, publish     (params/, plan/)
//   GradientReducer  where gradients go, buckets and their reductions, clearing       (grads/)
//   Stepper          norm, loss scale, schedule, the fused optimizer pass              (step/)
//   Checkpointer     save and load, through the store's views                          (checkpoint/)
//   CallGuard        the life cycle, the current call, the failure-safety rule         (comm/call_guard.*)
//   MicroStepWindow  where the accumulation window is                                  (plan/micro_step_window.hpp)
// Every C API call opens a CallScope, which names its errors and collectives in every part it goes through. The
// ZeRO stage is read in one place, the plan (plan/plan.hpp); the parts read the plan.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "checkpoint/checkpointer.hpp"
#include "comm/call_guard.hpp"
#include "comm/engine_comm.hpp"
#include "config/config.hpp"
#include "device/device_memory.hpp"
#include "device/transfer_stream.hpp"
#include "grads/grad_reducer.hpp"
#include "params/param_store.hpp"
#include "params/registration.hpp"
#include "plan/micro_step_window.hpp"
#include "plan/plan.hpp"
#include "step/stepper.hpp"

namespace zero {

class Engine {
 public:
  Engine(Config config, std::shared_ptr<Communicator> comm);
  // The all-gathers started after the last step (overlap_comm) are completed, waiting up to 5 s for the other
  // ranks, so that their buffers can be freed; what does not complete is left to the backend and never freed.
  ~Engine();

  // ---- registration (before finalize)
  int add_param_group(const std::string& name, double lr, double weight_decay, double beta1, double beta2, double eps);
  int add_param(ParamShape shape, ParamInit init);
  // The allocator of a memory space (experimental zero_engine_set_allocator). Before finalize.
  void set_allocator(MemorySpace space, std::shared_ptr<Allocator> allocator);
  // A device engine (experimental zero_engine_set_device): the model states in the runtime's device memory, the
  // norm and the step on the device. Before finalize; one runtime per process (device memory's operations are the
  // process's, as CUDA's current device is).
  void set_device(std::shared_ptr<device::Runtime> runtime);
  // The device engine's context (its runtime and the stream its work is ordered on); null for the CPU engine.
  const std::shared_ptr<device::DeviceContext>& device() const { return device_; }
  // ZeRO-Offload's transfers on a device engine (null otherwise): the failure tests stall them.
  device::OffloadTransfers* offload_transfers() { return offload_.get(); }
  // Where the engine's memory is, as DLPack numbers devices: kDLCPU (1, 0), kDLCUDA (2, ordinal), or kDLExtDev
  // (12, 0) for the emulator's memory, which no consumer may read.
  std::pair<int32_t, int32_t> dlpack_device() const;
  // Work queued on `stream` (a native stream of the engine's device) from now on runs after the engine's device work
  // queued so far; the host does not wait.
  void order_stream(void* stream);
  // zero_engine_set_stream (experimental): the framework's stream (a cudaStream_t, null being CUDA's legacy default
  // stream; on the emulator, a Stream it made). Each call's device work is then ordered after the work the framework
  // queued on it so far, and the framework's later work after the call's: no host waits. Without one, the host waits
  // for each call's device work before the call returns. A device engine's; any time.
  void set_stream(void* stream);
  // zero_engine_copy: host memory and the engine's (device memory of a device engine), ordered after the engine's
  // work, complete on return.
  void copy(void* dst, const void* src, size_t bytes);
  // The model-parallel group beside this data-parallel one (zero_engine_set_model_parallel); null or one rank: none.
  void set_model_parallel(std::shared_ptr<Communicator> group);
  void finalize();

  // ---- the micro-step
  void* param_data(int param);
  void* grad_data(int param);
  void gather(int unit);
  void release(int unit);
  void release_modified(int unit, int modifier_rank);
  void prefetch(int unit);
  void grad_ready(int param);
  void backward_end();
  // ---- the step (engine_step.cpp)
  StepResult step(const StepOptions& options = {});
  void set_lr(int group, double lr);
  // The learning rate the next step gives `group` (zero_get_lr).
  double next_lr(int group) const;
  // Collective. See core/checkpoint/checkpointer.cpp and docs/checkpoint-format.md.
  void save_checkpoint(const std::string& dir, const std::string& tag, bool exclude_frozen = false);
  void load_checkpoint(const std::string& dir, const std::string& tag);
  double loss_scale() const { return stepper_.loss_scale(); }
  // zero_engine_abort: any thread.
  void abort() { guard_.abort(); }
  void set_num_threads(int threads);

  // ---- what the engine reports about itself
  MemoryStats memory_stats() const { return store_.memory_stats(reducer_.buckets_held()); }
  // The same for zero_memory_stats and zero_memory_placement: ZERO_ERR_INVALID_STATE before finalize, when nothing
  // is planned yet.
  MemoryStats memory_report() const;
  MemoryStats placement_report() const;
  const Plan& plan() const { return store_.plan(); }
  const CommStats& comm_stats() const { return comm_.stats(); }
  std::string recent_collectives() const { return comm_.recent_json(); }
  const Config& config() const { return config_; }
  int rank() const { return comm_.rank(); }
  int world_size() const { return comm_.size(); }
  int model_parallel_rank() const { return model_parallel_ ? model_parallel_->rank() : 0; }
  int model_parallel_size() const { return model_parallel_ ? model_parallel_->size() : 1; }
  bool deterministic() const { return comm_.backend().capabilities().deterministic_sums; }
  double timeout() const { return comm_.timeout(); }
  int num_params() const { return registration_.num_params(); }
  int num_units() const { return guard_.state() == CallGuard::State::kRegistering ? 0 : store_.num_units(); }
  const ParamShape& param_shape(int param) const;
  UnitInfo unit_info(int unit) const;
  int optimizer_threads() const { return stepper_.threads(); }
  Isa isa() const { return stepper_.isa(); }
  const MicroStepWindow& window() const { return window_; }
  int64_t steps() const { return stepper_.steps(); }

 private:
  void check_window() const;
  void check_device_config() const;
  void warn_no_effect_keys(bool at_finalize) const;
  class DeviceCall;
  void check_param(int param) const;
  void check_trained(int param) const;
  void settle_fetches();
  PlanSpec plan_spec() const;
  // The sum of every rank's `local` of the whole job: over the model-parallel group, then the data-parallel one
  // (each in rank order), so every rank of the job gets the same bits. Inside a CallScope's data movement.
  double sum_over_job(double local, const std::string& what);
  MemoryStats planned_memory() const;  // inside a CallScope

  Config config_;
  std::shared_ptr<device::DeviceContext> device_;     // before the parts that keep device buffers: it outlives them
  std::unique_ptr<device::Stream> framework_stream_;  // zero_engine_set_stream's, or null
  std::unique_ptr<device::Event> call_begin_, call_end_, handed_over_;
  EngineComm comm_;
  std::unique_ptr<EngineComm> model_parallel_;  // null without a model-parallel group
  CallGuard guard_;
  MicroStepWindow window_;
  Registration registration_;
  ParameterStore store_;
  // ZeRO-Offload's transfers on a device engine: after the store (its slots), before the parts that drive them.
  std::unique_ptr<device::OffloadTransfers> offload_;
  GradientReducer reducer_;
  Stepper stepper_;
  Checkpointer checkpointer_;
};

}  // namespace zero
