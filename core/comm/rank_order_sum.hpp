// The deterministic sum behind every reduce-scatter libzero computes itself: after an all-to-all, each rank adds
// the N contributions to its block in rank order. Depends on nothing but the dtype conversions, so the MPI module
// (backends/mpi) links it too.
#pragma once

#include <cstddef>
#include <cstdint>

namespace zero {

// `buf` holds `n` blocks of `block` elements of `dtype` (ZERO_DTYPE_FP32, _BF16 or _FP16), one per rank. Block
// `into` becomes their element-wise sum, added in rank order 0, 1, ..., n-1; 16-bit values are summed in fp32 and
// rounded once to nearest even. The other blocks are left as they are.
void sum_blocks_in_rank_order(void* buf, size_t block, int n, int into, int32_t dtype);

}  // namespace zero
