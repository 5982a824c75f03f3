// Where a buffer lives. The placement plan (core/plan/plan.hpp) gives every buffer a space; the allocator of that space
// (memory/allocator.hpp) provides its bytes, and the memory operations and kernels are chosen by it
// (memory/ops.hpp, kernels/kernels.hpp). The CPU engine allocates host memory only; pinned host and device memory
// come with the CUDA build, NVMe with the offload engine, and a plan that asks for a space without an allocator
// fails at finalize with ZERO_ERR_UNSUPPORTED.
#pragma once

#include "zero/zero.h"

namespace zero {

// Values are zero_memory_space_t's (experimental API), so an allocator hook crosses the ABI without translation.
enum class MemorySpace { kHost = 0, kPinnedHost = 1, kDevice = 2, kNvme = 3 };
constexpr int kNumMemorySpaces = 4;

inline const char* space_name(MemorySpace s) {
  switch (s) {
    case MemorySpace::kHost:
      return "host";
    case MemorySpace::kPinnedHost:
      return "pinned host";
    case MemorySpace::kDevice:
      return "device";
    case MemorySpace::kNvme:
      return "nvme";
  }
  return "unknown";
}

// Whether the CPU can read and write the space's bytes directly (the engine's host code and kernels may touch it).
inline bool host_addressable(MemorySpace s) { return s == MemorySpace::kHost || s == MemorySpace::kPinnedHost; }

}  // namespace zero
