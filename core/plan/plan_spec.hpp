// The placement plan's settings from a config: one function, so that the engine and `zero-config estimate` plan
// the same thing from the same config.
#pragma once

#include "config/config.hpp"
#include "kernels/optimizer.hpp"
#include "plan/plan.hpp"

namespace zero {

// `compute_space` is where the engine keeps its model states: host memory for the CPU engine, device memory for
// a GPU engine. Offload to "nvme" moves the fp32 master and optimizer state (stages 1-3) or the param shards
// (stage 3) to a file; offload to "cpu" moves them to host memory (page-locked with pin_memory) when the engine
// computes in device memory, and is where the CPU engine keeps everything already. A block that does not apply
// at `stage` (the optimizer at stage 0, the params below stage 3) leaves those states in `compute_space`; the
// config parser rejects the NVMe cases that way round, so for a config's own stage that happens only with "cpu".
PlanSpec plan_spec_for(const Config& config, int stage, int world_size, int rank, MemorySpace compute_space);

}  // namespace zero
