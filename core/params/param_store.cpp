// The store's buffers: allocation as the plan places them, the views the other parts work through, and the
// accounting finalize checks against the plan.
#include "params/param_store.hpp"

#include "memory/ops.hpp"
#include "util/error.hpp"
#include "util/log.hpp"
#include "util/test_hooks.hpp"

namespace zero {
namespace {

void allocate_placed(Buffer& b, const Placement& p, const Allocators& allocators, const char* what) {
  if (p.extent == Extent::kNone || p.space == MemorySpace::kNvme) return;  // in the NVMe state's file
  b.allocate(p.space, p.elems, p.dtype, allocators.get(p.space, what));
}

}  // namespace

ParameterStore::~ParameterStore() {
  // A collective given up after a timeout (or a failure while in flight) may still be written by the backend:
  // its buffers must outlive the engine. Leaking them is the price of never crashing.
  if (comm_.abandoned_requests()) {
    leak();
    return;
  }
  // So must the buffers of all-gathers fetched ahead and never completed (an engine destroyed between a step and
  // the next gathers): those, and only those — unless host-staged, where the backend writes the staging's copies.
  if (comm_.host_staged()) return;
  for (const Fetch& f : fetches_) {
    Unit& unit = units_[f.unit];
    if (unit.gather_state() == Unit::GatherState::kPublishing)
      unit.params.leak();
    else if (unit.fetch_buffer() != nullptr)
      gathered_pool_.leak_one(unit.fetch_buffer());
  }
}

void ParameterStore::leak() {
  for (Unit& unit : units_) {
    unit.params.leak();
    unit.frozen.leak();
    unit.grads.leak();
  }
  gathered_pool_.leak();
}

void ParameterStore::allocate(const std::vector<ParamShape>& params, const NormSettings& norm) {
  units_.clear();
  test_hooks::maybe_fail("finalize.alloc", comm_.rank());
  units_.resize(plan_.units.size());
  unit_elems_.assign(plan_.units.size(), 0);
  for (size_t u = 0; u < units_.size(); ++u) {
    const UnitPlan& up = plan_.units[u];
    Unit& unit = units_[u];
    allocate_placed(unit.params, up.params, allocators_, "the params");
    allocate_placed(unit.frozen, up.frozen, allocators_, "the frozen params");
    allocate_placed(unit.grads, up.grads, allocators_, "the gradients");
    allocate_placed(unit.master, up.master, allocators_, "the fp32 master");
    for (int s = 0; s < 2; ++s) allocate_placed(unit.state[s], up.state[s], allocators_, "the optimizer state");
    unit.update_segments = layout_.segments(static_cast<int>(u), up.update_begin, up.update_elems, params);
    unit.norm_segments = layout_.segments(static_cast<int>(u), up.norm_begin, layout_.units[u].shard_elems, params);
    unit.uncounted_segments.clear();
    if (norm.leave_out_duplicates) {
      std::vector<ShardSegment> counted;
      for (const ShardSegment& s : unit.norm_segments)
        (params[s.param].model_parallel_duplicate ? unit.uncounted_segments : counted).push_back(s);
      unit.norm_segments = std::move(counted);
    }
    unit.start(up.sharded_params(), up.gathered_frozen_offset);
    unit_elems_[u] = layout_.units[u].padded_elems + layout_.units[u].frozen_elems;
  }
  // One gathered unit at a time is the documented footprint; it is allocated now, so that no collective allocates.
  const Placement& g = plan_.gathered;
  if (g.extent != Extent::kNone) {
    gathered_pool_.set_capacity(g.space, g.elems, g.dtype, allocators_.get(g.space, "a gathered unit"));
    gathered_pool_.reserve(1);
  }
  // ZeRO-Offload's host staging (two slots each way, the plan's): the device's gradients and the new params cross
  // through them.
  allocate_placed(offload_grad_slots_, plan_.cpu_offload_grad_slots, allocators_, "ZeRO-Offload's gradient staging");
  allocate_placed(offload_param_slots_, plan_.cpu_offload_param_slots, allocators_, "ZeRO-Offload's param staging");
  if (plan_.nvme_params.enabled) {
    std::vector<size_t> elems;
    for (const UnitPlan& up : plan_.units) elems.push_back(up.params.space == MemorySpace::kNvme ? up.params.elems : 0);
    nvme_params_ = new_state_file(
        "params", param_nvme_dir_,
        io::NvmeState::geometry(elems, 1, plan_.nvme_params.buffer_elems, 1, dtype_size(plan_.compute_dtype)),
        "zero_optimization.offload_param.nvme_path");
    param_copy_.assign(plan_.nvme_params.copy_bytes, 0);
    if (comm_.rank() == 0 && nvme_params_->in_memory_file_system())
      log_message(ZERO_LOG_WARNING, 0,
                  "offload_param to NVMe: nvme_path '" + param_nvme_dir_ +
                      "' is on a file system in memory (tmpfs): the offloaded params still take RAM");
  }
  if (plan_.optimizer_on_nvme()) {
    nvme_ = new_optimizer_file();
    warn_about_offload();
  }
  norm_plan_ = NormPlan(plan_, layout_, units_, norm, optimizer_on_nvme());
}

void ParameterStore::clear() {
  units_.clear();
  unit_elems_.clear();
  nvme_.reset();
  nvme_params_.reset();
  param_copy_.clear();
  bounce_.release();
  offload_grad_slots_.release();
  offload_param_slots_.release();
  gathered_pool_.clear();
  fetches_.clear();
  order_ = FetchOrder{};
  recording_.clear();
  norm_plan_ = NormPlan();
}

void ParameterStore::check_unit(int unit) const {
  if (unit < 0 || unit >= static_cast<int>(units_.size()))
    guard_.fail(ZERO_ERR_INVALID_ARGUMENT,
                "no unit " + std::to_string(unit) + " (units are 0.." + std::to_string(units_.size()) + "-1)");
}

UnitInfo ParameterStore::unit_info(int unit) const {
  UnitInfo info;
  const Unit& u = units_[unit];
  info.gathered = u.gathered();
  info.generation = u.generation();
  const UnitLayout& ul = layout_.units[unit];
  info.num_params = static_cast<int>(ul.params.size() + ul.frozen_params.size());
  for (int p : ul.params) info.numel += layout_.params[p].numel;
  for (int p : ul.frozen_params) info.numel += layout_.params[p].numel;
  return info;
}

GradientView ParameterStore::grads(int u) {
  Buffer& g = units_[u].grads;
  return GradientView{g.data(), g.dtype(), g.space(), g.size()};
}

float* ParameterStore::master(int u) {
  Unit& unit = units_[u];
  if (master_on_nvme()) return nullptr;
  if (plan_.separate_master()) return unit.master.f32();
  // fp32 params in the params file: read into the copy buffer by begin_copy(u), written back by end_copy(u).
  if (master_in_params_file(u)) return reinterpret_cast<float*>(param_copy_.data());
  return unit.params.f32() + plan_.units[u].update_in_params;
}

UpdateView ParameterStore::update(int u) {
  Unit& unit = units_[u];
  const UnitPlan& up = plan_.units[u];
  UpdateView v;
  v.segments = &unit.update_segments;
  v.grads = unit.grads.at(up.update_in_grads);
  v.master = master(u);
  for (int s = 0; s < 2; ++s) v.state[s] = optimizer_on_nvme() || unit.state[s].empty() ? nullptr : unit.state[s].f32();
  v.first_index = up.element_base + up.update_begin;
  v.space = unit.grads.space();
  v.master_space = plan_.separate_master() ? up.master.space : up.params.space;  // the plan's, allocated or not
  return v;
}

const void* ParameterStore::norm_grads(int u) const {
  const Buffer& g = units_[u].grads;
  return static_cast<const char*>(g.data()) + plan_.units[u].norm_in_grads * dtype_size(g.dtype());
}

void* ParameterStore::copy(int u) {
  if (!plan_.separate_master()) return nullptr;
  if (params_on_nvme(u)) return param_copy_.data();  // between begin_copy(u) and end_copy(u)
  return units_[u].params.at(plan_.units[u].update_in_params);
}

MemoryStats ParameterStore::memory_stats(size_t buckets_held) const {
  return plan_.bytes(buckets_held, gathered_pool_.buffers());
}

MemoryStats ParameterStore::allocated_bytes(uint64_t bucket_bytes) const {
  MemoryStats s;
  uint64_t device = 0;  // what lives in device memory (a GPU engine's plan); the rest is host memory
  for (const Unit& unit : units_) {
    s.param_bytes += unit.params.n_bytes();
    s.frozen_param_bytes += unit.frozen.n_bytes();
    s.grad_bytes += unit.grads.n_bytes();
    s.master_param_bytes += unit.master.n_bytes();
    s.optimizer_state_bytes += unit.state[0].n_bytes() + unit.state[1].n_bytes();
    for (const Buffer* b : {&unit.params, &unit.frozen, &unit.grads, &unit.master, &unit.state[0], &unit.state[1]}) {
      if (b->space() == MemorySpace::kDevice) device += b->n_bytes();
      if (b->space() == MemorySpace::kPinnedHost) s.pinned_bytes += b->n_bytes();
    }
  }
  s.bucket_bytes = bucket_bytes;
  s.gathered_bytes = gathered_pool_.allocated_bytes();
  if (plan_.bucket.space == MemorySpace::kDevice) device += bucket_bytes;
  if (gathered_pool_.space() == MemorySpace::kDevice) device += s.gathered_bytes;
  s.device_bytes = device;
  const uint64_t offload_staging = offload_grad_slots_.n_bytes() + offload_param_slots_.n_bytes();
  for (const Buffer* b : {&offload_grad_slots_, &offload_param_slots_})
    if (b->space() == MemorySpace::kPinnedHost) s.pinned_bytes += b->n_bytes();
  s.host_bytes = s.total() - device + param_copy_.size() + offload_staging;
  s.staging_bytes = param_copy_.size() + offload_staging;
  if (nvme_params_ != nullptr) {  // the offloaded param shards, as the file holds them
    const io::NvmeState::Geometry& g = nvme_params_->geometry();
    for (size_t n : g.unit_elems) s.param_bytes += n * g.elem_size;
    s.staging_bytes += g.staging_bytes();
    s.host_bytes += g.staging_bytes();
    s.nvme_bytes += g.file_bytes();
  }
  if (nvme_ != nullptr) {  // the offloaded kinds, as the file holds them
    const io::NvmeState::Geometry& g = nvme_->geometry();
    uint64_t elems = 0;
    for (size_t n : g.unit_elems) elems += n;
    const int states = g.arrays - (plan_.nvme_optimizer.master ? 1 : 0);
    if (plan_.nvme_optimizer.master) s.master_param_bytes += elems * sizeof(float);
    s.optimizer_state_bytes += elems * sizeof(float) * static_cast<uint64_t>(states);
    s.staging_bytes += g.staging_bytes();
    s.host_bytes += g.staging_bytes();
    s.nvme_bytes += g.file_bytes();
  }
  return s;
}

}  // namespace zero
