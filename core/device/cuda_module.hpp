// The CUDA runtime, from its module: libzero-cuda.so.1 (core/device/cuda_runtime.cu) is loaded at run time like the
// MPI module, so libzero.so itself links no CUDA and runs where none is installed.
#pragma once

#include <cstdint>
#include <memory>

#include "device/runtime.hpp"
#include "zero/zero.h"

// The module's one entry point. On success *out is a Runtime the caller owns (delete through the interface); on
// failure `error` (capacity bytes) says why (no device, a driver too old, another libzero's module).
#define ZERO_CUDA_MODULE_SONAME "libzero-cuda.so.1"
#define ZERO_CUDA_MODULE_ENTRY "zero_cuda_runtime_open"
extern "C" {
typedef zero_status_t (*zero_cuda_runtime_open_fn)(zero::device::Runtime** out, uint32_t interface_version,
                                                   uint64_t interface_layout, char* error, size_t capacity);
}

namespace zero {
namespace device {

// The CUDA runtime on the current device: ZERO_CUDA_MODULE (a path), else the SONAME, else next to libzero.so.
// Throws ZERO_ERR_UNSUPPORTED naming what was tried, or the module's own reason (no device, ...).
std::unique_ptr<Runtime> open_cuda_runtime();

}  // namespace device
}  // namespace zero
