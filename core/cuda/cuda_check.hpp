// CUDA runtime errors as zero::Error (CUDA sources only).
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "util/error.hpp"

namespace zero {
namespace cuda {

inline void check(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return;
  const zero_status_t status = err == cudaErrorMemoryAllocation                                 ? ZERO_ERR_OUT_OF_MEMORY
                               : err == cudaErrorNoDevice || err == cudaErrorInsufficientDriver ? ZERO_ERR_UNSUPPORTED
                                                                                                : ZERO_ERR_INTERNAL;
  fail(status, std::string(what) + ": " + cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ")");
}

// After a launch: a bad configuration shows at once; an error inside the kernel shows at the next synchronization.
inline void check_launch(const char* kernel) { check(cudaGetLastError(), kernel); }

inline cudaStream_t as_stream(void* stream) { return static_cast<cudaStream_t>(stream); }

}  // namespace cuda
}  // namespace zero
