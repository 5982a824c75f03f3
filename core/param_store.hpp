// The parameter store: the layout, the placement plan, and every buffer of this rank's model states — params,
// gradient accumulators, the fp32 master, the optimizer state, and the pool of transient gathered units. It
// allocates exactly what the plan says (and checks that it did), brings in rank 0's initial values, gathers and
// releases units, publishes new params after a step, and gives the gradient reducer, the stepper and the
// checkpointer views of what each works on. It is the only part of the engine that knows where a unit's bytes are.
#pragma once

#include <string>
#include <vector>

#include "call_guard.hpp"
#include "comm/engine_comm.hpp"
#include "layout.hpp"
#include "memory/allocator.hpp"
#include "memory/buffer.hpp"
#include "memory/pool.hpp"
#include "plan.hpp"
#include "registration.hpp"

namespace zero {

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
    void* gathered = nullptr;                 // while gathered: the full params (a pooled buffer when they are sharded)
    uint64_t generation = 0;                  // bumped by every gather and release (views in bindings check it)
    std::vector<ShardSegment> segments;       // what the optimizer updates, relative to update_begin
    std::vector<ShardSegment> norm_segments;  // what this rank adds to the norm, relative to norm_begin
  };

  ParameterStore(EngineComm& comm, CallGuard& guard) : comm_(comm), guard_(guard) {}
  ~ParameterStore();

  Allocators& allocators() { return allocators_; }
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
  // The first gathered unit, or -1.
  int first_gathered() const;
  void* gathered(int unit) { return units_[unit].gathered; }
  UnitInfo unit_info(int unit) const;

  // ---- views for the reducer, the stepper and the checkpointer
  UnitBuffers& unit(int u) { return units_[u]; }
  const UnitBuffers& unit(int u) const { return units_[u]; }
  const UnitPlan& unit_plan(int u) const { return plan_.units[u]; }
  // The fp32 values this rank updates: the separate master, or the params themselves when they are fp32.
  float* master(int u);
  // Where the optimizer writes the compute-dtype copy of what this rank updates (null when params are the master).
  void* copy(int u);
  // The reduced gradients of what this rank updates, and of what it adds to the norm.
  void* update_grads(int u) { return units_[u].grads.at(plan_.units[u].update_in_grads); }
  const void* norm_grads(int u) { return units_[u].grads.at(plan_.units[u].norm_in_grads); }
  // This rank's shard [rank * S, (rank + 1) * S) of the fp32 master, an optimizer state and the params (what a
  // checkpoint stores per rank, whatever the stage).
  const float* master_shard(int u);
  const float* state_shard(int u, int s);
  const void* params_shard(int u);

  // ---- after a step or a checkpoint load
  void clear_grads();
  // After an optimizer pass that zeroed the gradients it read (KernelArgs::clear_grad): the rest of each gradient
  // buffer (stage 1: the other ranks' blocks, which the reduce-scatter left in the communication dtype). The
  // elements between params were never written, so they are still zero.
  void clear_grads_not_updated();
  // Rounds the fp32 master into the compute-dtype params (separate master only).
  void write_params_from_master();
  // Every unit whose plan publishes after the step: all-gathers the shards this rank updated (collective).
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
};

}  // namespace zero
