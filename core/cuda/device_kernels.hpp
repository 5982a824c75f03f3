// The GPU kernels of the CUDA build (-DZERO_CUDA=ON): the fused optimizer step over many segments, the gradient
// norm's sum of squares, the gradient conversions, and a plain copy (the bandwidth ceiling the benchmark compares
// against). Declared without CUDA's headers, so host code and tests include this file in any build; a stream is
// a cudaStream_t passed as void* (nullptr: the legacy default stream).
//
// Every kernel computes each element with the CPU's operations (kernels/step_element.hpp, kernels/element_ops.hpp,
// dtype.hpp), so its results equal the CPU kernels' bit for bit: tests/gpu/kernels_test.cpp compares them on a GPU.
// Errors (no device, a failed launch) throw zero::Error; the launches are asynchronous on `stream`.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "cuda/launch_table.hpp"
#include "kernels/kernels.hpp"
#include "kernels/step_element.hpp"
#include "numeric/dtype.hpp"

namespace zero {
namespace cuda {

// Whether a CUDA device can be used; if not, `why` says what the runtime answered ("no CUDA-capable device is
// detected", "CUDA driver version is insufficient", ...).
bool device_available(std::string* why);
// The name of the current device, e.g. "NVIDIA H200".
std::string device_name();

// One fused launch per entry of `table.launches`: every chunk's elements stepped as the CPU's step_kernel does.
// `segments` and `chunks` are device copies of the host arrays the table was planned from (segments' pointers are
// device pointers; block_sums and clear_grad must be unset: the GPU norm is its own pass, and clearing is a
// memset on the stream).
void launch_step(OptimizerKind kind, DType grad, CopyMode copy, const LaunchTable& table,
                 const KernelArgs* device_segments, const StepChunk* device_chunks, void* stream);

// The sum of squares of n gradients, with the bits of parallel_sum_squares(kernels(...).sum_squares[grad], ...)
// on the CPU: blocks of kSumBlockElems, each in 16 fp64 lanes and the fixed tree, the block sums added in block
// order. `scratch` is device memory of at least sum_squares_scratch_doubles(n) doubles; the result is written to
// device memory at `result`.
inline size_t sum_squares_scratch_doubles(size_t n) {
  return sum_squares_blocks(n) * (kernel_detail::kSquareLanes + 1);
}
void launch_sum_squares(DType grad, const void* device_grad, size_t n, double* scratch, double* result, void* stream);

// Gradient conversions with the CPU kernels' bits (kernels/kernels.hpp): narrow fp32 -> 16-bit, widen 16-bit -> fp32,
// accumulate acc[i] += src[i] (into_zero: 0 + src[i]). On the GPU, source and destination must not overlap (every
// element is converted at once, not front to back).
void launch_narrow(DType to, void* dst, const float* src, size_t n, void* stream);
void launch_widen(DType from, float* dst, const void* src, size_t n, void* stream);
void launch_accumulate(DType from, float* acc, const void* src, size_t n, bool into_zero, void* stream);

// dst = src, n bytes (n a multiple of 16, both 16-byte aligned): the device's copy bandwidth, for the benchmark.
void launch_copy(void* dst, const void* src, size_t n, void* stream);

}  // namespace cuda
}  // namespace zero
