// The parameter store: the layout, the placement plan, and every buffer of this rank's model states — params,
// gradient accumulators, the fp32 master, the optimizer state, and the pool of transient gathered units. It
// allocates exactly what the plan says (and checks that it did), brings in rank 0's initial values, gathers and
// releases units, publishes new params after a step, and hands the reducer, the stepper and the checkpointer
// narrow views of what each works on. It is the only part of the engine that knows where a unit's bytes are.
//
// The code is split by what it does: param_store.cpp (allocation, views, accounting), gathering.cpp (gather,
// release, prefetch, publish; fetch_ahead.hpp decides what goes ahead), initial_values.cpp (finalize's
// broadcast), shard_io.cpp (shards in memory or in the NVMe files, as the optimizer and checkpoints read them).
#pragma once

#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "comm/call_guard.hpp"
#include "comm/engine_comm.hpp"
#include "memory/allocator.hpp"
#include "memory/pool.hpp"
#include "nvme/nvme_state.hpp"
#include "params/fetch_ahead.hpp"
#include "params/norm_plan.hpp"
#include "params/registration.hpp"
#include "params/unit.hpp"
#include "plan/layout.hpp"
#include "plan/micro_step_window.hpp"
#include "plan/plan.hpp"

namespace zero {

struct UnitInfo {
  bool gathered = false;
  int num_params = 0;
  uint64_t generation = 0;
  uint64_t numel = 0;
};

// A unit's gradient buffer, the one thing of a unit the reducer writes: the full unit (stages 0-1: the framework
// adds into it and the reduction runs in place) or the reduced shard's accumulator (stages 2-3).
struct GradientView {
  void* data = nullptr;
  DType dtype = DType::kF32;
  MemorySpace space = MemorySpace::kHost;
  size_t elems = 0;
  char* at(size_t index) const { return static_cast<char*>(data) + index * dtype_size(dtype); }
};

// What the optimizer updates of a unit: its runs of params, the reduced gradients they read (which the pass may
// clear), and the fp32 master and state in memory (null where they are in the NVMe file).
struct UpdateView {
  const std::vector<ShardSegment>* segments = nullptr;
  void* grads = nullptr;
  float* master = nullptr;
  float* state[2] = {nullptr, nullptr};
  uint64_t first_index = 0;                       // the range's first element among all units' elements without padding
  MemorySpace space = MemorySpace::kHost;         // the gradients'
  MemorySpace master_space = MemorySpace::kHost;  // the master's and the state's (ZeRO-Offload: host memory)
};

// The fp32 arrays of what a rank updates, as checkpoints store them.
enum class ShardKind { kMaster, kState0, kState1 };
inline ShardKind state_shard(int s) { return s == 0 ? ShardKind::kState0 : ShardKind::kState1; }

class ParameterStore {
 public:
  ParameterStore(EngineComm& comm, CallGuard& guard, const MicroStepWindow& window)
      : comm_(comm), guard_(guard), window_(window) {}
  ~ParameterStore();

  Allocators& allocators() { return allocators_; }
  // Where the NVMe offloads put their files (before allocate).
  void set_offload_targets(std::string optimizer_dir, std::string params_dir, io::AioSettings aio) {
    nvme_dir_ = std::move(optimizer_dir), param_nvme_dir_ = std::move(params_dir), aio_ = aio;
  }
  // Before finalize: the plan of the stage without units (so that calls before finalize know whether a gather
  // would be collective). At finalize: the layout and the plan of the registered units.
  void set_plan(Layout layout, Plan plan) { layout_ = std::move(layout), plan_ = std::move(plan); }
  const Layout& layout() const { return layout_; }
  const Plan& plan() const { return plan_; }
  int num_units() const { return static_cast<int>(units_.size()); }
  const Unit& unit(int u) const { return units_[u]; }
  const UnitPlan& unit_plan(int u) const { return plan_.units[u]; }
  // Which pass sums each unit's squares of the norm (decided at allocate).
  const NormPlan& norm_plan() const { return norm_plan_; }

  // ---- finalize
  // Allocates what the plan places, from the allocators of its spaces, and decides the norm's passes. Local;
  // throws (bad_alloc, zero::Error).
  void allocate(const std::vector<ParamShape>& params, const NormSettings& norm);
  void clear();  // after a failed finalize
  // Rank 0's initial values to every rank, in fp32 pieces (collective, moves data).
  void load_initial_values(const Registration& registration, DType compute_dtype);

  // ---- gather and release (gathering.cpp)
  void check_unit(int unit) const;
  // Collective for units with sharded params (an agreement, then an all-gather); local otherwise.
  void gather(int unit);
  void release(int unit);
  // zero_release_modified: rank `modifier_rank`'s gathered values become every rank's params, shards and master,
  // then the unit is released. Collective (an agreement, then broadcasts).
  void release_modified(int unit, int modifier_rank, bool micro_step_begun);
  // zero_prefetch (experimental): starts the all-gather of a unit with sharded params now; zero_gather takes it.
  // Collective (an agreement, then the start); local and nothing to do for units with full params.
  void prefetch(int unit);
  void set_fetch_policy(const FetchPolicy& policy) { policy_ = policy; }
  // Completes every all-gather started ahead and gives back what was fetched ahead (the step changes the params;
  // a checkpoint reads or writes them), and forgets gathers made since the last micro-step ended. Moves data: inside
  // CallGuard::moving_data.
  void settle();
  bool fetches_in_flight() const { return !fetches_.empty(); }
  // An engine going away: completes the fetches still in flight within `seconds` (the other ranks, at the same
  // point, complete theirs), so that their buffers can be freed; what does not complete is left to the backend.
  void drain(double seconds);
  // zero_backward_end: the order of this micro-step's gathers becomes the order the next one prefetches in.
  void end_micro_step();
  // The first gathered unit, or -1.
  int first_gathered() const;
  // A gathered unit's full params and full frozen bytes (null when it is not gathered, or has none).
  void* gathered(int unit) const { return units_[unit].view(); }
  void* gathered_frozen(int unit) const { return units_[unit].frozen_view(); }
  // Where those views' bytes are.
  MemorySpace gathered_space(int unit) const {
    return units_[unit].sharded() ? gathered_pool_.space() : units_[unit].params.space();
  }
  UnitInfo unit_info(int unit) const;
  // Every unit whose plan publishes after the step: all-gathers the shards this rank updated (collective). With
  // FetchPolicy::background_publish they are started and complete at the unit's zero_gather (or settle()).
  void publish(const std::string& what);

  // ---- views for the reducer and the stepper
  GradientView grads(int u);
  UpdateView update(int u);
  // The reduced gradients this rank adds to the norm, and their runs.
  const void* norm_grads(int u) const;
  // Where the optimizer writes the compute-dtype copy of what this rank updates (null when params are the master).
  // Writers bracket it with begin_copy(u) and end_copy(u): with offload_param it is a buffer in memory that
  // end_copy writes to the params file. fp32 params offloaded are the master itself: begin_copy reads the shard
  // from the params file into that buffer, the optimizer updates it in place (update(u).master), end_copy writes it
  // back.
  void* copy(int u);
  void begin_copy(int u);
  void end_copy(int u);
  // ZeRO-Offload's host staging for one run's gradients on their way from the device, and one run's new params on
  // their way to it (the plan's slots; null and 0 without ZeRO-Offload).
  void* offload_grad_staging() { return offload_grad_slots_.data(); }
  size_t offload_grad_staging_bytes() const { return offload_grad_slots_.n_bytes(); }
  void* offload_param_staging() { return offload_param_slots_.data(); }
  size_t offload_param_staging_bytes() const { return offload_param_slots_.n_bytes(); }
  // Rounds the fp32 master into the compute-dtype params (separate master only).
  void write_params_from_master();

  // ---- NVMe offload (shard_io.cpp)
  // offload_optimizer to NVMe: the file and window (null otherwise), and which of its arrays holds what (none:
  // in memory).
  io::NvmeState* nvme() { return nvme_.get(); }
  bool optimizer_on_nvme() const { return nvme_ != nullptr; }
  bool master_on_nvme() const { return optimizer_on_nvme() && plan_.nvme_optimizer.master; }
  std::optional<int> file_array(ShardKind kind) const;
  // offload_param to NVMe: whether unit u's param shard is in the params file.
  bool params_on_nvme(int u) const {
    return plan_.units[u].params.space == MemorySpace::kNvme && plan_.units[u].params.elems > 0;
  }
  // fp32 params are their own master: offloaded, the one fp32 copy of the shard is in the params file, and the
  // optimizer file (if any) holds only the state.
  bool master_in_params_file(int u) const { return !plan_.separate_master() && params_on_nvme(u); }
  // A checkpoint's load into an offloaded engine: the state is streamed into a second file of the same layout,
  // which replaces the current one only once every rank read everything (so a failed load changes nothing).
  std::unique_ptr<io::NvmeState> new_optimizer_file() const;
  void adopt_optimizer_file(std::unique_ptr<io::NvmeState> state) { nvme_ = std::move(state); }
  // zero_step: a warning if a param file was deleted under the engine (the optimizer's is checked by its pass).
  void check_nvme_files();

  // ---- what a checkpoint stores per rank: this rank's shard [rank * S, (rank + 1) * S), whatever the stage
  // (shard_io.cpp). The fp32 shards are handed to `sink` in pieces (one piece in memory; pieces of a bounded buffer
  // when offloaded).
  void read_shard(int u, ShardKind kind, const std::function<void(const void*, size_t bytes)>& sink);
  void read_params_shard(int u, const std::function<void(const void*, size_t bytes)>& sink);
  // The whole updated range of unit u's master or optimizer state, and of its params (compute dtype), as a
  // checkpoint's load sets them.
  void write_updated(int u, ShardKind kind, const float* values);
  void write_params_shard(int u, const void* values);
  // The frozen bytes: this rank's shard [rank * S, (rank + 1) * S) of unit u's, as checkpoints store them; and the
  // range this rank keeps (its shard, or the whole unit's where they are whole), which a load sets.
  void read_frozen_shard(int u, const std::function<void(const void*, size_t bytes)>& sink) const;
  // `bytes` at `p` in `space`, handed to `sink` where the host can read them (device memory in pieces through a
  // bounce buffer).
  void sink_bytes(MemorySpace space, const void* p, size_t bytes,
                  const std::function<void(const void*, size_t bytes)>& sink) const;
  size_t frozen_kept_begin(int u) const;
  size_t frozen_kept_bytes(int u) const { return units_[u].frozen.size(); }
  void write_frozen_kept(int u, const void* bytes);

  // What the plan places, with the gathered buffers allocated now; finalize checks it against the buffers.
  MemoryStats memory_stats(size_t buckets_held) const;
  MemoryStats allocated_bytes(uint64_t bucket_bytes) const;
  // A collective was given up in flight: its buffers must outlive the engine.
  void leak();

 private:
  void broadcast_initial_values(const Registration& registration, DType compute_dtype, std::vector<float>& staging);
  void broadcast_frozen_values(const Registration& registration, int u, std::vector<float>& staging);
  std::vector<char> units_in_compute_dtype(const Registration& registration, DType compute_dtype);
  void broadcast_compute_values(const Registration& registration, int u, DType compute_dtype,
                                std::vector<float>& staging, std::vector<float>& widened);
  std::unique_ptr<io::NvmeState> new_state_file(const char* kind, const std::string& dir,
                                                const io::NvmeState::Geometry& geometry, const char* key) const;
  // finalize: a warning when the offload saves no host memory.
  void warn_about_offload() const;
  float* master(int u);

  // ---- fetching ahead (gathering.cpp)
  struct Fetch {
    int unit = 0;
    std::vector<EngineComm::Pending> pending;  // the params' all-gather, and the frozen bytes'
  };
  // Completes the fetches started up to and including `unit`'s, in start order.
  void complete_fetch(int unit);
  AheadPlan plan_ahead_of(int unit) const;
  void put_own_shard(int unit, void* buffer);
  std::vector<EngineComm::Pending> start_unit_all_gather(int unit, void* buffer, const std::string& label);
  // Starts the all-gather of `unit` into a reserved pooled buffer.
  void start_prefetch(int unit);
  uint64_t live_elements() const;

  EngineComm& comm_;
  CallGuard& guard_;
  const MicroStepWindow& window_;
  Allocators allocators_;
  Layout layout_;
  Plan plan_;
  NormPlan norm_plan_;
  std::vector<Unit> units_;
  std::vector<uint64_t> unit_elems_;  // padded elements per unit (fetching ahead counts them)
  BufferPool gathered_pool_;
  std::string nvme_dir_, param_nvme_dir_;
  io::AioSettings aio_;
  std::unique_ptr<io::NvmeState> nvme_;
  std::unique_ptr<io::NvmeState> nvme_params_;  // offload_param: the param shards of units that are not resident
  std::vector<char> param_copy_;                // one shard: where the optimizer writes a unit's new params
  mutable Buffer bounce_;  // a device engine's checkpoints: device memory read through it (pinned host memory)
  Buffer offload_grad_slots_, offload_param_slots_;  // ZeRO-Offload's staging (Plan::cpu_offload_*_slots)

  FetchPolicy policy_;
  std::deque<Fetch> fetches_;   // in start order
  FetchOrder order_;            // the previous micro-step's gathers, and this one's position in them
  std::vector<int> recording_;  // this micro-step's
};

}  // namespace zero
