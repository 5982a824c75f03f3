#include "plan/plan_spec.hpp"

namespace zero {

PlanSpec plan_spec_for(const Config& config, int stage, int world_size, int rank, MemorySpace compute_space) {
  PlanSpec spec;
  spec.stage = stage;
  spec.compute_dtype = config.compute_dtype;
  spec.grad_accum_dtype = config.grad_accum_dtype;
  spec.optimizer_states = state_count(config.optimizer);
  spec.persistence_threshold = config.param_persistence_threshold;
  spec.bucket_elems = config.reduce_bucket_size;
  spec.space = compute_space;
  spec.optimizer_space = compute_space;
  spec.params_space = compute_space;
  spec.world_size = world_size;
  spec.rank = rank;
  const OffloadConfig& o = config.offload;
  const bool on_device = compute_space == MemorySpace::kDevice;
  if (stage == 3 && o.params_nvme()) {
    spec.params_space = MemorySpace::kNvme;
    spec.nvme_param_buffer_elems = o.param_buffer_size;
  } else if (stage == 3 && on_device && o.params == OffloadConfig::Device::kCpu) {
    spec.params_space = o.pin_params ? MemorySpace::kPinnedHost : MemorySpace::kHost;
  }
  if (stage >= 1 && o.nvme()) {
    spec.optimizer_space = MemorySpace::kNvme;
    spec.nvme_chunk_elems = o.chunk_elems;
    spec.nvme_buffers = o.buffer_count;
  } else if (stage >= 1 && on_device && o.optimizer == OffloadConfig::Device::kCpu) {
    spec.optimizer_space = o.pin_optimizer ? MemorySpace::kPinnedHost : MemorySpace::kHost;
  }
  return spec;
}

}  // namespace zero
