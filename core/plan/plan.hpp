// The placement plan: what one rank keeps of every unit, as what (whole, a shard, transient), where (memory
// space) and in which dtype, and how gradients are reduced and new params published. Computed once at finalize
// from the layout and the config. This is the one place that reads the ZeRO stage: the engine allocates and runs
// what the plan says, zero_memory_stats reports the plan's bytes (finalize checks them against what was actually
// allocated), and `zero-config estimate` prints the plan of a model it describes. Offloading and device residency
// are new values in a plan, not new branches in the engine.
//
// What each stage decides (P: the unit's padded elements, S = P / N the rank's shard):
// clang-format off
//   stage | params            | grads (accum dtype)  | master, opt. state | reduction            | publishing
//   0     | full P            | full P               | full P (all ranks) | all-reduce, in step  | none needed
//   1     | full P            | full P               | shard S            | reduce-scatter, step | all-gather after step
//   2     | full P            | shard S (buckets)    | shard S            | buckets in backward  | all-gather after step
//   3     | shard S (full P   | shard S              | shard S            | buckets in backward  | gathered on demand
//         |  if persistent)   |                      |                    |                      | (persistent: as 2)
// clang-format on
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "memory/space.hpp"
#include "numeric/dtype.hpp"
#include "plan/layout.hpp"

namespace zero {

// What a rank keeps of a buffer kind of one unit.
enum class Extent { kNone, kFull, kShard };

struct Placement {
  Extent extent = Extent::kNone;
  MemorySpace space = MemorySpace::kHost;
  DType dtype = DType::kF32;
  size_t elems = 0;  // 0 with kNone
  uint64_t bytes() const { return static_cast<uint64_t>(elems) * dtype_size(dtype); }
};

// How the gradients of a step are reduced.
enum class GradReduction {
  kAllReduceInStep,      // stage 0: every rank gets every summed gradient
  kReduceScatterInStep,  // stage 1: each rank gets the sum of its shard, in zero_step
  kBucketsInBackward,    // stages 2-3: buckets are reduce-scattered into shard accumulators as backward goes
};

// How a unit's new params reach every rank after the step.
enum class Publish {
  kNone,                // every rank updated the whole unit (stage 0)
  kAllGatherAfterStep,  // each rank updated its shard of a full copy: all-gathered after the step
  kGatherOnDemand,      // sharded params: zero_gather all-gathers them into a transient buffer
};

struct UnitPlan {
  Placement params;    // compute dtype
  Placement frozen;    // the frozen params' bytes (kU8): full, or this rank's shard where the params are sharded
  Placement grads;     // accumulation dtype: what the framework adds into (kFull) or the reduced shard (kShard)
  Placement master;    // fp32 master of what this rank updates; kNone when the params are fp32 (they are the master)
  Placement state[2];  // fp32 optimizer state of what this rank updates
  Publish publish = Publish::kNone;
  bool persistent = false;  // stage 3: small enough to stay resident (stage3_param_persistence_threshold)
  bool sharded = false;     // stage 3 and not persistent: a shard of the params and frozen bytes, gathered on demand
  // The element range of the unit this rank updates, and where it starts inside the params and grads buffers.
  size_t update_begin = 0, update_elems = 0;
  size_t update_in_params = 0, update_in_grads = 0;
  // The range this rank adds to the squared gradient norm (its shard, at every stage, so that every rank computes
  // the same norm from the same partial sums), and where it starts inside the grads buffer.
  size_t norm_begin = 0, norm_in_grads = 0;
  uint64_t element_base = 0;   // the unit's first element among all units' elements without padding (rounding keys)
  uint64_t global_offset = 0;  // the same among all units' padded elements (checkpoints)
  // Where the frozen bytes start in a gathered buffer of the unit (after its params, at a 64-byte boundary).
  size_t gathered_frozen_offset = 0;

  bool sharded_params() const { return sharded; }
};

// The bytes of one rank's model states, by kind (wherever they live), and by where: host memory (the kinds placed
// there, plus the window offloaded state streams through) and the NVMe file (the offloaded kinds, each unit padded
// to 4 KiB).
struct MemoryStats {
  uint64_t param_bytes = 0, grad_bytes = 0, master_param_bytes = 0, optimizer_state_bytes = 0, bucket_bytes = 0,
           gathered_bytes = 0, frozen_param_bytes = 0;
  // staging: the windows offloaded state streams through (NVMe) and ZeRO-Offload's transfer slots. host: host
  // memory, pinned included; pinned: the part of it that is page-locked; device: GPU memory.
  uint64_t staging_bytes = 0, host_bytes = 0, pinned_bytes = 0, device_bytes = 0, nvme_bytes = 0;
  uint64_t total() const {
    return param_bytes + grad_bytes + master_param_bytes + optimizer_state_bytes + bucket_bytes + gathered_bytes +
           frozen_param_bytes;
  }
  bool operator==(const MemoryStats& o) const {
    return param_bytes == o.param_bytes && grad_bytes == o.grad_bytes && master_param_bytes == o.master_param_bytes &&
           frozen_param_bytes == o.frozen_param_bytes && optimizer_state_bytes == o.optimizer_state_bytes &&
           bucket_bytes == o.bucket_bytes && gathered_bytes == o.gathered_bytes && staging_bytes == o.staging_bytes &&
           host_bytes == o.host_bytes && pinned_bytes == o.pinned_bytes && device_bytes == o.device_bytes &&
           nvme_bytes == o.nvme_bytes;
  }
};

// The settings a plan depends on (from the config, the optimizer and the communicator).
struct PlanSpec {
  int stage = 0;
  DType compute_dtype = DType::kF32;
  DType grad_accum_dtype = DType::kF32;
  int optimizer_states = 2;                // 0-2 fp32 buffers per updated element
  int64_t persistence_threshold = 100000;  // elements (stage 3)
  int64_t bucket_elems = 500000000;        // reduce_bucket_size (stages 2-3)
  MemorySpace space = MemorySpace::kHost;  // where the model states live (host: the CPU engine; device: a GPU's)
  // Where the fp32 master and the optimizer state live: `space`; kNvme (offload_optimizer device nvme, stages
  // 1-3), streamed through buffer_count chunks of chunk_elems elements; or, when `space` is the device, host or
  // pinned host memory (offload_optimizer device cpu, stages 1-3: ZeRO-Offload), with the gradient shards beside
  // them from stage 2. plan_spec_for (plan_spec.hpp) sets these three spaces from a config.
  MemorySpace optimizer_space = MemorySpace::kHost;
  int64_t nvme_chunk_elems = 0;
  int nvme_buffers = 0;
  // Where stage 3's param shards live (units that do not stay resident): `space`, or kNvme (offload_param device
  // nvme), read and written through a buffer of nvme_param_buffer_elems, or host or pinned host memory when `space` is
  // the device (offload_param device cpu).
  MemorySpace params_space = MemorySpace::kHost;
  int64_t nvme_param_buffer_elems = 0;
  int world_size = 1, rank = 0;
};

// The NVMe-offloaded optimizer state's geometry (nvme/nvme_state.hpp): how many fp32 arrays per updated element, how
// the file and the window are laid out. Empty without offload.
struct NvmeOptimizerPlan {
  int arrays = 0;       // the master (when separate) and the optimizer states
  bool master = false;  // array 0 is the master
  int64_t chunk_elems = 0;
  int buffers = 0;
  uint64_t file_bytes = 0, staging_bytes = 0;
};

// The param shards on NVMe (offload_param): one 16-bit array; the buffer reads and writes go through, and one
// shard's worth of memory where the optimizer writes a unit's new params before they go to the file.
struct NvmeParamsPlan {
  bool enabled = false;
  int64_t buffer_elems = 0;
  uint64_t file_bytes = 0, buffer_bytes = 0, copy_bytes = 0, offloaded_bytes = 0;
};

struct Plan {
  int stage = 0;
  MemorySpace space = MemorySpace::kHost;  // where the model states live unless offloaded (PlanSpec::space)
  int world_size = 1, rank = 0;
  GradReduction reduction = GradReduction::kAllReduceInStep;
  bool sharded_optimizer = false;  // each rank updates its shard (stage 1 on) rather than every element
  bool params_sharded = false;     // units keep only a shard of their params (stage 3; small units may persist)
  std::vector<UnitPlan> units;
  std::vector<BucketLayout> buckets;  // kBucketsInBackward only
  std::vector<int> bucket_of_unit;    // per unit, -1 without buckets
  std::vector<size_t> offset_in_bucket;
  Placement bucket;  // one transient gradient bucket: the largest (kNone without buckets)
  // One transient gathered unit, in bytes (kU8): the largest sharded one, its params and then its frozen bytes (kNone
  // without sharded units); and the most elements, trained and frozen, one holds (what fetching ahead counts, as
  // DeepSpeed counts params' elements).
  Placement gathered;
  size_t gathered_elems = 0;
  NvmeOptimizerPlan nvme_optimizer;
  NvmeParamsPlan nvme_params;
  // ZeRO-Offload (the optimizer in host memory, the params on the device): two slots each of gradient pieces going
  // to the host and new params going back, each piece one reduction's shard (kNone otherwise).
  Placement cpu_offload_grad_slots, cpu_offload_param_slots;
  DType compute_dtype = DType::kF32, grad_accum_dtype = DType::kF32;
  // A separate fp32 master: with 16-bit params, and with any params when the optimizer is offloaded to the host.
  bool master_separate = false;

  bool separate_master() const { return master_separate; }
  bool bucketed() const { return reduction == GradReduction::kBucketsInBackward; }
  bool optimizer_on_nvme() const { return nvme_optimizer.arrays > 0; }
  // The plan's bytes with `buckets_held` gradient buckets and `units_gathered` sharded units gathered at once
  // (the engine's footprint is the plan with one of each; more only while a caller gathers several units).
  MemoryStats bytes(size_t buckets_held = 1, size_t units_gathered = 1) const;
  // One line per buffer kind, for the log and `zero-config estimate`.
  std::string describe() const;
};

// Throws ZERO_ERR_INVALID_ARGUMENT for a stage outside 0-3.
Plan make_plan(const PlanSpec& spec, const Layout& layout);

const char* extent_name(Extent e);

}  // namespace zero
