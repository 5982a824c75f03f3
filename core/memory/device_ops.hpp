// The memory operations on device memory, a space the CPU cannot address. The device runtime provides them
// (device/device_memory.hpp, device::install_device_memory()), and until it has,
// copy_bytes, fill_zero and element_ops (memory/ops.hpp) fail on device memory with ZERO_ERR_UNSUPPORTED.
#pragma once

#include <cstddef>

#include "memory/ops.hpp"

namespace zero {

// Work on device memory is ordered on the device's stream, not waited for: the host never reads device memory
// itself, and every later operation on it — another of these, the device's kernels, a copy out — runs after it. A
// copy with host memory on one side is complete when it returns (the host may then read or reuse its side).
struct DeviceMemoryOps {
  // Between device memory and any memory (host, pinned or device); `host_side`: one side is host memory.
  void (*copy)(void* dst, const void* src, size_t bytes, bool host_side);
  void (*fill_zero)(void* p, size_t bytes);
  ElementOps element;  // on device memory
};

// Null removes them. Set once at start-up, before any engine uses device memory.
void set_device_memory_ops(const DeviceMemoryOps* ops);
const DeviceMemoryOps* device_memory_ops();

}  // namespace zero
