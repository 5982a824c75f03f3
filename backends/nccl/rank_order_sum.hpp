// The deterministic reduce-scatter's device sum (rank_order_sum.cu).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

namespace zero {
namespace nccl {

enum class SumType { kF32, kBF16, kF16 };

// `own`: this rank's block of its own input, overwritten with the sum; `received`: `ranks` blocks of `count`
// elements, block r holding rank r's contribution (block `me` unused). Queued on `stream`.
cudaError_t sum_received_in_rank_order(SumType type, void* own, const void* received, size_t count, int ranks, int me,
                                       cudaStream_t stream);

}  // namespace nccl
}  // namespace zero
