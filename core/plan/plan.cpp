#include "plan/plan.hpp"

#include <algorithm>
#include <sstream>

#include "nvme/nvme_state.hpp"
#include "util/error.hpp"

namespace zero {
namespace {

Placement place(Extent extent, MemorySpace space, DType dtype, size_t elems) {
  Placement p;
  p.extent = elems == 0 ? Extent::kNone : extent;
  p.space = space;
  p.dtype = dtype;
  p.elems = elems;
  return p;
}

// ZeRO-Offload's host staging. One transfer carries one unit's piece of this rank's shard: its reduced gradients
// (stages 2-3: the whole shard as its bucket's reduction left it, in the communication dtype, no wider than the
// accumulation dtype; stage 1: the updated range, reduced in zero_step) device to host, and its new 16-bit params
// host to device (only those whose params live on the device: offload_param at stage 3 leaves the persistent units
// there; fp32 params are sent from the master). Two slots each way, so that one piece crosses the bus while the
// CPU works on the other.
void plan_offload_staging(const PlanSpec& spec, Plan& plan) {
  size_t grad_piece = 0, param_piece = 0;
  for (const UnitPlan& up : plan.units) {
    const size_t reduced = plan.bucketed() && up.grads.extent == Extent::kShard ? up.grads.elems : 0;
    grad_piece = std::max({grad_piece, up.update_elems, reduced});
    // fp32 params go to the device from the updated master itself: no slot.
    if (up.params.space == MemorySpace::kDevice && spec.compute_dtype != DType::kF32)
      param_piece = std::max(param_piece, up.update_elems);
  }
  // The slots are page-locked whatever pin_memory says: they are small, and a copy from pageable memory would block
  // the CPU instead of running beside it. Each is a multiple of 256 elements, so the second is as aligned as the
  // first.
  constexpr size_t kSlots = 2, kAlign = 256;
  grad_piece = (grad_piece + kAlign - 1) / kAlign * kAlign;
  param_piece = (param_piece + kAlign - 1) / kAlign * kAlign;
  plan.cpu_offload_grad_slots =
      place(Extent::kFull, MemorySpace::kPinnedHost, spec.grad_accum_dtype, kSlots * grad_piece);
  plan.cpu_offload_param_slots =
      place(Extent::kFull, MemorySpace::kPinnedHost, spec.compute_dtype, kSlots * param_piece);
}

}  // namespace

const char* extent_name(Extent e) {
  switch (e) {
    case Extent::kNone:
      return "none";
    case Extent::kFull:
      return "full";
    case Extent::kShard:
      return "shard";
  }
  return "unknown";
}

Plan make_plan(const PlanSpec& spec, const Layout& layout) {
  if (spec.stage < 0 || spec.stage > 3)
    fail(ZERO_ERR_INVALID_ARGUMENT, "ZeRO stage " + std::to_string(spec.stage) + " does not exist (0-3)");
  Plan plan;
  plan.stage = spec.stage;
  plan.space = spec.space;
  plan.world_size = spec.world_size;
  plan.rank = spec.rank;
  plan.compute_dtype = spec.compute_dtype;
  plan.grad_accum_dtype = spec.grad_accum_dtype;
  // The three things a stage decides: whether gradients are sharded (from stage 2, reduced during backward),
  // whether params are (stage 3, except persistent units), and whether a rank updates everything (stage 0) or
  // its shard of the optimizer state (stage 1 on).
  const bool shard_optimizer = spec.stage >= 1;
  const bool shard_grads = spec.stage >= 2;
  const bool shard_params = spec.stage >= 3;
  plan.sharded_optimizer = shard_optimizer;
  plan.params_sharded = shard_params;
  plan.reduction = shard_grads       ? GradReduction::kBucketsInBackward
                   : shard_optimizer ? GradReduction::kReduceScatterInStep
                                     : GradReduction::kAllReduceInStep;

  const MemorySpace space = spec.space;
  // ZeRO-Offload (a GPU engine with offload to "cpu"): the fp32 master, the optimizer state and, from stage 2, the
  // gradient shards live in host memory, where the CPU's kernels step them; the device keeps the 16-bit params
  // (stage 3: their shards, or none of them with the params offloaded too), the buckets and the gathered units.
  const bool optimizer_on_host = space == MemorySpace::kDevice && host_addressable(spec.optimizer_space);
  const bool params_on_host = space == MemorySpace::kDevice && host_addressable(spec.params_space);
  if (optimizer_on_host && !shard_optimizer)
    fail(ZERO_ERR_CONFIG,
         "offloading the optimizer state to the CPU needs ZeRO stage 1, 2 or 3 (stage 0 updates every element on "
         "every rank)");
  if (params_on_host && !shard_params)
    fail(ZERO_ERR_CONFIG, "offloading the params to the CPU needs ZeRO stage 3 (stages 0-2 keep every param)");
  if (params_on_host && !optimizer_on_host)
    fail(ZERO_ERR_UNSUPPORTED,
         "offload_param \"cpu\" without offload_optimizer \"cpu\": the device would update param shards that live "
         "in host memory; offload the optimizer too (as ZeRO-Infinity does) or keep the params on the device");
  if (params_on_host && spec.compute_dtype == DType::kF32)
    fail(ZERO_ERR_UNSUPPORTED,
         "offload_param \"cpu\" with fp32 params: libzero offloads 16-bit param shards beside the fp32 master "
         "(bf16.enabled or fp16.enabled); with fp32, offload_optimizer alone keeps the master in host memory");
  if (space == MemorySpace::kDevice &&
      (spec.optimizer_space == MemorySpace::kNvme || spec.params_space == MemorySpace::kNvme))
    fail(ZERO_ERR_UNSUPPORTED,
         "NVMe offload on a GPU engine is not planned yet (the state would stream NVMe -> host -> device); offload "
         "to \"cpu\" instead");
  // Offloaded to host memory, the master is separate even for fp32 params: the device's copy is what the
  // framework computes with, the host's is what the CPU updates.
  plan.master_separate = spec.compute_dtype != DType::kF32 || optimizer_on_host;
  const MemorySpace grads_space = optimizer_on_host && shard_grads ? spec.optimizer_space : space;
  size_t largest_gathered = 0, most_gathered_elems = 0;
  uint64_t element_base = 0, global_offset = 0;
  plan.units.resize(layout.units.size());
  for (size_t u = 0; u < layout.units.size(); ++u) {
    const UnitLayout& ul = layout.units[u];
    UnitPlan& up = plan.units[u];
    const size_t full = ul.padded_elems, shard = ul.shard_elems, own = spec.rank * shard;
    // As DeepSpeed counts a param's elements, frozen or not, whatever their type.
    up.persistent = shard_params && ul.used_elems + ul.frozen_elems <
                                        static_cast<uint64_t>(std::max<int64_t>(0, spec.persistence_threshold));
    const bool sharded = shard_params && !up.persistent;
    up.sharded = sharded;
    // A unit of frozen params only has no trained elements, in no offloaded space either.
    up.params = place(sharded ? Extent::kShard : Extent::kFull, sharded && shard > 0 ? spec.params_space : space,
                      spec.compute_dtype, sharded ? shard : full);
    // Frozen bytes stay in `space` (offload_param moves only the trained shards to its file).
    up.frozen = place(sharded ? Extent::kShard : Extent::kFull, space, DType::kU8,
                      sharded ? ul.frozen_shard_bytes : ul.frozen_padded_bytes);
    up.grads = place(shard_grads ? Extent::kShard : Extent::kFull, grads_space, spec.grad_accum_dtype,
                     shard_grads ? shard : full);
    up.update_begin = shard_optimizer ? own : 0;
    up.update_elems = shard_optimizer ? shard : full;
    const Extent updated = shard_optimizer ? Extent::kShard : Extent::kFull;
    if (plan.master_separate) up.master = place(updated, spec.optimizer_space, DType::kF32, up.update_elems);
    for (int s = 0; s < spec.optimizer_states && s < 2; ++s)
      up.state[s] = place(updated, spec.optimizer_space, DType::kF32, up.update_elems);
    up.update_in_params = sharded ? 0 : up.update_begin;
    up.update_in_grads = shard_grads ? 0 : up.update_begin;
    up.norm_begin = own;
    up.norm_in_grads = shard_grads ? 0 : own;
    up.publish = sharded ? Publish::kGatherOnDemand : shard_optimizer ? Publish::kAllGatherAfterStep : Publish::kNone;
    up.element_base = element_base;
    element_base += ul.used_elems;
    up.global_offset = global_offset;
    global_offset += full;
    const size_t param_bytes = full * dtype_size(spec.compute_dtype);
    up.gathered_frozen_offset = (param_bytes + kFrozenAlignBytes - 1) / kFrozenAlignBytes * kFrozenAlignBytes;
    if (sharded) {
      largest_gathered = std::max(largest_gathered,
                                  ul.has_frozen() ? up.gathered_frozen_offset + ul.frozen_padded_bytes : param_bytes);
      most_gathered_elems = std::max<size_t>(most_gathered_elems, full + ul.frozen_elems);
    }
  }
  plan.gathered = place(Extent::kFull, space, DType::kU8, largest_gathered);
  plan.gathered_elems = most_gathered_elems;
  if (spec.params_space == MemorySpace::kNvme) {
    if (!shard_params)
      fail(ZERO_ERR_CONFIG, "offloading the params to NVMe needs ZeRO stage 3 (stages 0-2 keep every param)");
    NvmeParamsPlan& po = plan.nvme_params;
    std::vector<size_t> elems;
    size_t largest = 0;
    for (const UnitPlan& up : plan.units) {
      const size_t n = up.params.space == MemorySpace::kNvme ? up.params.elems : 0;
      elems.push_back(n);
      largest = std::max(largest, n);
      po.offloaded_bytes += up.params.space == MemorySpace::kNvme ? up.params.bytes() : 0;
    }
    // A read or write never spans more than one shard: the buffer need not be larger than the largest.
    po.buffer_elems =
        std::min<int64_t>(spec.nvme_param_buffer_elems, static_cast<int64_t>(std::max<size_t>(largest, 1)));
    const io::NvmeState::Geometry g =
        io::NvmeState::geometry(elems, 1, po.buffer_elems, 1, dtype_size(spec.compute_dtype));
    po.enabled = g.file_bytes() > 0;
    po.file_bytes = g.file_bytes();
    po.buffer_bytes = g.staging_bytes();
    po.copy_bytes = po.enabled ? largest * dtype_size(spec.compute_dtype) : 0;
  }
  if (spec.optimizer_space == MemorySpace::kNvme) {
    if (!shard_optimizer)
      fail(ZERO_ERR_CONFIG,
           "offloading the optimizer state to NVMe needs ZeRO stage 1, 2 or 3 (stage 0 updates "
           "every element on every rank)");
    NvmeOptimizerPlan& o = plan.nvme_optimizer;
    o.master = spec.compute_dtype != DType::kF32;
    o.arrays = (o.master ? 1 : 0) + std::min(spec.optimizer_states, 2);
    o.chunk_elems = spec.nvme_chunk_elems;
    o.buffers = spec.nvme_buffers;
    std::vector<size_t> elems;
    for (const UnitPlan& up : plan.units) elems.push_back(up.update_elems);
    const io::NvmeState::Geometry g = io::NvmeState::geometry(elems, o.arrays, o.chunk_elems, o.buffers);
    o.file_bytes = g.file_bytes();
    o.staging_bytes = g.staging_bytes();
  }

  plan.bucket_of_unit.assign(layout.units.size(), -1);
  plan.offset_in_bucket.assign(layout.units.size(), 0);
  if (plan.bucketed()) {
    plan.buckets = build_buckets(layout, spec.bucket_elems);
    size_t largest_bucket = 0;
    for (size_t b = 0; b < plan.buckets.size(); ++b) {
      largest_bucket = std::max(largest_bucket, plan.buckets[b].elems);
      for (size_t i = 0; i < plan.buckets[b].units.size(); ++i) {
        plan.bucket_of_unit[plan.buckets[b].units[i]] = static_cast<int>(b);
        plan.offset_in_bucket[plan.buckets[b].units[i]] = plan.buckets[b].unit_offsets[i];
      }
    }
    plan.bucket = place(Extent::kFull, space, spec.grad_accum_dtype, largest_bucket);
  }
  if (optimizer_on_host) plan_offload_staging(spec, plan);
  return plan;
}

MemoryStats Plan::bytes(size_t buckets_held, size_t units_gathered) const {
  MemoryStats m;
  uint64_t in_space[kNumMemorySpaces] = {};
  auto add = [&](const Placement& p, uint64_t& kind, uint64_t times = 1) {
    kind += p.bytes() * times;
    in_space[static_cast<int>(p.space)] += p.bytes() * times;
  };
  for (const UnitPlan& up : units) {
    add(up.params, m.param_bytes);
    add(up.frozen, m.frozen_param_bytes);
    add(up.grads, m.grad_bytes);
    add(up.master, m.master_param_bytes);
    add(up.state[0], m.optimizer_state_bytes);
    add(up.state[1], m.optimizer_state_bytes);
  }
  add(bucket, m.bucket_bytes, buckets_held);
  add(gathered, m.gathered_bytes, units_gathered);
  add(cpu_offload_grad_slots, m.staging_bytes);
  add(cpu_offload_param_slots, m.staging_bytes);
  // NVMe offload streams through host memory; the file pads each unit (its bytes are the file's, not the kinds').
  m.staging_bytes += nvme_optimizer.staging_bytes + nvme_params.buffer_bytes + nvme_params.copy_bytes;
  m.nvme_bytes = nvme_optimizer.file_bytes + nvme_params.file_bytes;
  m.pinned_bytes = in_space[static_cast<int>(MemorySpace::kPinnedHost)];
  m.host_bytes = in_space[static_cast<int>(MemorySpace::kHost)] + m.pinned_bytes + nvme_optimizer.staging_bytes +
                 nvme_params.buffer_bytes + nvme_params.copy_bytes;
  m.device_bytes = in_space[static_cast<int>(MemorySpace::kDevice)];
  return m;
}

std::string Plan::describe() const {
  size_t full = 0, sharded = 0, persistent = 0;
  for (const UnitPlan& up : units) {
    (up.sharded_params() ? sharded : full) += 1;
    persistent += up.persistent ? 1 : 0;
  }
  const UnitPlan* first = units.empty() ? nullptr : &units[0];
  std::ostringstream os;
  os << "stage " << stage << " on " << world_size << " ranks: ";
  os << "params "
     << (sharded ? (full ? "sharded (" + std::to_string(persistent) + " persistent units full)" : "sharded")
                 : std::string("full"));
  if (first != nullptr) {
    os << ", grads " << extent_name(first->grads.extent) << " " << dtype_name(grad_accum_dtype);
    os << ", optimizer state " << (sharded_optimizer ? "sharded" : "full");
    if (separate_master()) os << ", fp32 master beside " << dtype_name(compute_dtype) << " params";
    os << " (" << space_name(space) << ")";
    // Spaces from every unit: unit 0 may be a persistent one, or its params offloaded.
    const Placement* offloaded_state = nullptr;
    bool params_on_host = false, grads_on_host = false;
    for (const UnitPlan& up : units) {
      for (const Placement* p : {&up.master, &up.state[0], &up.state[1]})
        if (p->extent != Extent::kNone && p->space != space && host_addressable(p->space)) offloaded_state = p;
      params_on_host |= space == MemorySpace::kDevice && up.sharded_params() && host_addressable(up.params.space);
      grads_on_host |= space == MemorySpace::kDevice && host_addressable(up.grads.space);
    }
    if (offloaded_state != nullptr)
      os << "; fp32 master, optimizer state" << (grads_on_host ? ", gradient shards" : "") << " offloaded to "
         << space_name(offloaded_state->space) << " memory (two " << cpu_offload_grad_slots.bytes() / 2
         << "-byte gradient transfer slots, pinned)";
    if (params_on_host) os << "; param shards offloaded to host memory";
    if (nvme_params.enabled)
      os << "; param shards offloaded to NVMe (" << nvme_params.file_bytes << " bytes in a file)";
    if (optimizer_on_nvme())
      os << (nvme_optimizer.master ? "; fp32 master and optimizer state" : "; optimizer state")
         << " offloaded to NVMe (" << nvme_optimizer.file_bytes << " bytes in a file, streamed through a "
         << nvme_optimizer.staging_bytes << "-byte window)";
  }
  os << "; gradients "
     << (reduction == GradReduction::kAllReduceInStep ? "all-reduced in zero_step"
         : reduction == GradReduction::kReduceScatterInStep
             ? "reduce-scattered in zero_step"
             : std::to_string(buckets.size()) + " bucket(s) reduce-scattered during backward");
  return os.str();
}

}  // namespace zero
