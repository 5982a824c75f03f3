// The CUDA build's kernels, run by the emulator's stream workers on host-usable pointers: the same per-element
// functions as the GPU's (the CPU's portable path, kernels/element_ops.hpp, which cuda/*.cu compile for the device)
// in the same order, so each element gets the GPU kernel's bits.
#pragma once

#include <cstddef>
#include <functional>

#include "cuda/launch_table.hpp"
#include "kernels/kernels.hpp"
#include "numeric/dtype.hpp"

namespace zero {
namespace device {
namespace emulated {

// `segments` and `chunks` are readable; the segments' pointers are device addresses, which `shadow` maps to
// readable ones.
void step(OptimizerKind kind, DType grad, CopyMode copy_mode, const cuda::LaunchTable& table,
          const KernelArgs* segments, const cuda::StepChunk* chunks, const std::function<void*(const void*)>& shadow);
// launch_sum_squares's results: block sums of kSumBlockElems elements, added in block order from 0.
void sum_squares(DType grad, const void* grads, size_t n, double* scratch, double* result);
void narrow(DType to, void* dst, const float* src, size_t n);
void widen(DType from, float* dst, const void* src, size_t n);
void accumulate(DType from, float* acc, const void* src, size_t n, bool into_zero);

}  // namespace emulated
}  // namespace device
}  // namespace zero
