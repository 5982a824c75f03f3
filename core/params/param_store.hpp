// The parameter store: the layout, the placement plan, and every buffer of this rank's model states — params,
// gradient accumulators, the fp32 master, the optimizer state, and the pool of transient gathered units. It
// allocates exactly what the plan says (and checks that it did), brings in rank 0's initial values, gathers and
// releases units, publishes new params after a step, and gives the gradient reducer, the stepper and the
// checkpointer views of what each works on. It is the only part of the engine that knows where a unit's bytes are.
#pragma once

#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "comm/call_guard.hpp"
#include "comm/engine_comm.hpp"
#include "memory/allocator.hpp"
#include "memory/buffer.hpp"
#include "memory/pool.hpp"
#include "nvme/nvme_state.hpp"
#include "params/registration.hpp"
#include "plan/layout.hpp"
#include "plan/plan.hpp"

namespace zero {

// What the store fetches ahead of zero_gather (config: overlap_comm and the stage3_ keys; docs/architecture.md,
// "Fetching ahead").
struct FetchPolicy {
  bool background_publish = false;  // the all-gathers after the step complete when a unit is gathered
  int64_t prefetch_elements = 0;    // stage 3: how far ahead of the recorded order to all-gather
  int64_t max_live_elements = 0;    // stage 3: what the store may hold on its own (prefetched or kept)
  int64_t max_reuse_distance = 0;   // stage 3: keep a released unit needed again within this many elements
};

struct UnitInfo {
  bool gathered = false;
  int num_params = 0;
  uint64_t generation = 0;
  uint64_t numel = 0;
};

class ParameterStore {
 public:
  // What one rank keeps of one unit: the buffers its UnitPlan places, plus the gather state.
  struct UnitBuffers {
    Buffer params;    // compute dtype: the full unit, or this rank's shard (UnitPlan::params)
    Buffer master;    // fp32 master of what this rank updates; empty when params are fp32 (they are the master)
    Buffer grads;     // accumulation dtype: the full unit, or the reduced shard (UnitPlan::grads)
    Buffer state[2];  // fp32 optimizer state of what this rank updates
    void* gathered = nullptr;  // while gathered: the full params (a pooled buffer when they are sharded)
    uint64_t generation = 0;   // bumped by every gather and release (views in bindings check it)
    // Fetched ahead (stage 3): the unit's full params, all-gathered before zero_gather asked (prefetch) or kept
    // after zero_release (reuse); valid until the step. The next zero_gather takes it without communicating.
    void* ahead = nullptr;
    bool fetching = false;                    // an all-gather into params (publish) or `ahead` (prefetch) is in flight
    bool held = false;                        // counted in live_elements_: prefetched, or to be kept at its release
    bool keep = false;                        // decided at its zero_gather: zero_release keeps the buffer as `ahead`
    std::vector<ShardSegment> segments;       // what the optimizer updates, relative to update_begin
    std::vector<ShardSegment> norm_segments;  // what this rank adds to the norm, relative to norm_begin
  };

  ParameterStore(EngineComm& comm, CallGuard& guard) : comm_(comm), guard_(guard) {}
  ~ParameterStore();

  Allocators& allocators() { return allocators_; }
  // Where a plan that offloads the optimizer state to NVMe puts its file (before allocate).
  void set_offload_target(std::string dir, io::AioSettings aio) { nvme_dir_ = std::move(dir), aio_ = aio; }
  void set_param_offload_target(std::string dir) { param_nvme_dir_ = std::move(dir); }
  // offload_param to NVMe: whether unit u's param shard is in the params file.
  bool params_offloaded(int u) const { return plan_.units[u].params.space == MemorySpace::kNvme; }
  // Before finalize: the plan of the stage without units (so that calls before finalize know whether a gather
  // would be collective). At finalize: the layout and the plan of the registered units.
  void set_plan(Layout layout, Plan plan) { layout_ = std::move(layout), plan_ = std::move(plan); }
  const Layout& layout() const { return layout_; }
  const Plan& plan() const { return plan_; }
  int num_units() const { return static_cast<int>(units_.size()); }

  // ---- finalize
  // Allocates what the plan places, from the allocators of its spaces. Local; throws (bad_alloc, zero::Error).
  void allocate(const std::vector<ParamShape>& params);
  void clear();  // after a failed finalize
  // Rank 0's initial values to every rank, in fp32 pieces (collective, moves data).
  void load_initial_values(const Registration& registration, DType compute_dtype);

  // ---- gather and release (zero_gather, zero_release, and the consolidated checkpoint)
  void check_unit(int unit, const char* call) const;
  // Collective for units with sharded params (an agreement, then an all-gather); local otherwise.
  void gather(int unit, const char* call);
  void release(int unit, const char* call);
  // zero_prefetch (experimental): starts the all-gather of a unit with sharded params now; zero_gather takes it.
  // Collective (an agreement, then the start); local and nothing to do for units with full params.
  void prefetch(int unit, const char* call);

  // ---- fetching ahead (overlap_comm)
  void set_fetch_policy(const FetchPolicy& policy) { policy_ = policy; }
  // Completes every all-gather started ahead and gives back what was fetched ahead (the step changes the params;
  // a checkpoint reads or writes them), and forgets gathers made since the last micro-step ended. Moves data:
  // inside CallGuard::moving_data.
  void settle();
  bool fetches_in_flight() const { return !fetches_.empty(); }
  // An engine going away: completes the fetches still in flight within `seconds` (the other ranks, at the same
  // point, complete theirs), so that their buffers can be freed; what does not complete is left to the backend.
  void drain(double seconds);
  // zero_backward_end: the order of this micro-step's gathers becomes the order the next one prefetches in.
  void end_micro_step();
  // Whether the micro-step now running is followed by another of the same accumulation window (no zero_step in
  // between): then fetching ahead may reach into the next micro-step's first units. The same on every rank.
  void set_next_micro_step_in_window(bool yes) { wrap_ = yes; }
  // The first gathered unit, or -1.
  int first_gathered() const;
  void* gathered(int unit) { return units_[unit].gathered; }
  UnitInfo unit_info(int unit) const;

  // ---- views for the reducer, the stepper and the checkpointer
  UnitBuffers& unit(int u) { return units_[u]; }
  const UnitBuffers& unit(int u) const { return units_[u]; }
  const UnitPlan& unit_plan(int u) const { return plan_.units[u]; }
  // The fp32 values this rank updates: the separate master, or the params themselves when they are fp32. Null
  // when the master is offloaded (offloaded_master()).
  float* master(int u);
  // offload_optimizer to NVMe: the file and window (null otherwise), and which of its arrays holds what (-1:
  // not offloaded).
  io::NvmeState* nvme() { return nvme_.get(); }
  bool offloaded() const { return nvme_ != nullptr; }
  bool offloaded_master() const { return offloaded() && plan_.offload.master; }
  int master_array() const { return offloaded_master() ? 0 : -1; }
  int state_array(int s) const { return offloaded() ? (plan_.offload.master ? 1 : 0) + s : -1; }
  // Where the optimizer writes the compute-dtype copy of what this rank updates (null when params are the master).
  // Writers bracket it with begin_copy(u) and end_copy(u): with offload_param it is a buffer in memory that
  // end_copy writes to the params file.
  void* copy(int u);
  void begin_copy(int u);
  void end_copy(int u);
  // The whole updated range of unit u's params (compute dtype), as a checkpoint's load sets it.
  void write_params_shard(int u, const void* values);
  // The reduced gradients of what this rank updates, and of what it adds to the norm.
  void* update_grads(int u) { return units_[u].grads.at(plan_.units[u].update_in_grads); }
  const void* norm_grads(int u) { return units_[u].grads.at(plan_.units[u].norm_in_grads); }
  // This rank's shard [rank * S, (rank + 1) * S) of the fp32 master (kind -1) or an optimizer state (kind s), and
  // the params: what a checkpoint stores per rank, whatever the stage. The fp32 shards are handed to `sink` in
  // pieces (one piece in memory; pieces of a bounded buffer when offloaded).
  void read_shard(int u, int kind, const std::function<void(const void*, size_t bytes)>& sink);
  void read_params_shard(int u, const std::function<void(const void*, size_t bytes)>& sink);
  // Writes the whole updated range of unit u's master (kind -1) or optimizer state s (a checkpoint's load).
  void write_updated(int u, int kind, const float* values);
  // A checkpoint's load into an offloaded engine: the state is streamed into a second file of the same layout,
  // which replaces the current one only once every rank read everything (so a failed load changes nothing).
  // `call` prefixes an error's message ("" where the caller's own error handling names the call).
  std::unique_ptr<io::NvmeState> new_offload_state(const char* call) const;
  std::unique_ptr<io::NvmeState> new_state_file(const char* kind, const std::string& dir,
                                                const io::NvmeState::Geometry& geometry, const char* key,
                                                const char* call) const;
  void adopt_offload_state(std::unique_ptr<io::NvmeState> state) { nvme_ = std::move(state); }
  // finalize: a warning when the offload saves no host memory.
  void warn_about_offload() const;
  // zero_step: a warning if a param file was deleted under the engine (the optimizer's is checked by its pass).
  void check_offload_files();

  // ---- after a step or a checkpoint load
  void clear_grads();
  // After an optimizer pass that zeroed the gradients it read (KernelArgs::clear_grad): the rest of each gradient
  // buffer (stage 1: the other ranks' blocks, which the reduce-scatter left in the communication dtype). The
  // elements between params were never written, so they are still zero.
  void clear_grads_not_updated();
  // Rounds the fp32 master into the compute-dtype params (separate master only).
  void write_params_from_master();
  // Every unit whose plan publishes after the step: all-gathers the shards this rank updated (collective). With
  // FetchPolicy::background_publish they are started and complete at the unit's zero_gather (or settle()).
  void publish(const std::string& what);

  // What the plan places, with the gathered buffers allocated now; finalize checks it against the buffers.
  MemoryStats memory_stats(size_t buckets_held) const;
  MemoryStats allocated_bytes(uint64_t bucket_bytes) const;
  // A collective was given up in flight: its buffers must outlive the engine.
  void leak();

 private:
  void broadcast_initial_values(const Registration& registration, DType compute_dtype, std::vector<float>& staging);

  EngineComm& comm_;
  CallGuard& guard_;
  Allocators allocators_;
  Layout layout_;
  Plan plan_;
  std::vector<UnitBuffers> units_;
  BufferPool gathered_pool_;
  std::string nvme_dir_;
  io::AioSettings aio_;
  std::unique_ptr<io::NvmeState> nvme_;
  std::string param_nvme_dir_;
  std::unique_ptr<io::NvmeState> nvme_params_;  // offload_param: the param shards of units that are not resident
  std::vector<char> param_copy_;                // one shard: where the optimizer writes a unit's new params

  // ---- fetching ahead
  struct Fetch {
    int unit = 0;
    EngineComm::Pending pending;
  };
  // Completes the fetches started up to and including `unit`'s, in start order.
  void complete_fetch(int unit);
  // At zero_gather(unit) of a unit with sharded params, agreed by every rank: moves the cursor through the
  // recorded order, decides whether zero_release keeps the unit, and returns the units to prefetch now. Depends
  // only on what every rank shares (the agreed gathers and the policy), never on local zero_release timing, so
  // every rank starts the same collectives.
  struct AheadPlan {
    size_t cursor = 0;
    bool lost = false;
    bool keep = false;
    std::vector<int> prefetch;
  };
  AheadPlan plan_ahead(int unit) const;
  void put_own_shard(int unit, void* buffer);
  // Starts the all-gather of `unit` into a reserved pooled buffer (its `ahead`).
  void start_prefetch(int unit);
  uint64_t unit_elems(int unit) const { return layout_.units[unit].padded_elems; }
  uint64_t buffer_elems() const { return plan_.gathered.elems; }

  FetchPolicy policy_;
  std::deque<Fetch> fetches_;   // in start order
  std::vector<int> order_;      // the sharded units gathered in the previous micro-step, in order
  std::vector<int> recording_;  // this micro-step's
  size_t cursor_ = 0;           // the position in order_ after the last gather that followed it
  bool order_lost_ = false;     // this micro-step left the recorded order: no fetching ahead until it ends
  bool wrap_ = false;           // set_next_micro_step_in_window
  uint64_t live_elements_ = 0;  // pooled buffers held by the store's own choice (UnitBuffers::held), in elements
};

}  // namespace zero
