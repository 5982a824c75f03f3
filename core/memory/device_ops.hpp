// The memory operations on device memory, a space the CPU cannot address. The device runtime provides them
// (device/device_memory.hpp, device::install_device_memory()), and until it has,
// copy_bytes, fill_zero and element_ops (memory/ops.hpp) fail on device memory with ZERO_ERR_UNSUPPORTED.
#pragma once

#include <cstddef>

#include "memory/ops.hpp"

namespace zero {

struct DeviceMemoryOps {
  // Copies between device memory and any memory (host, pinned or device), complete when it returns.
  void (*copy)(void* dst, const void* src, size_t bytes);
  void (*fill_zero)(void* p, size_t bytes);
  ElementOps element;  // on device memory, complete when they return
};

// Null removes them. Set once at start-up, before any engine uses device memory.
void set_device_memory_ops(const DeviceMemoryOps* ops);
const DeviceMemoryOps* device_memory_ops();

}  // namespace zero
