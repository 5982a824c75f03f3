// The deterministic sum behind every reduce-scatter libzero computes itself: each rank adds the N contributions to
// its block in rank order. Depends on nothing but the dtype conversions, so the MPI module (backends/mpi) links it
// too, for both of its paths (an all-to-all then this sum; or the shared-memory window, summed straight from the
// peers' slots): the same arithmetic, so both give the same bits.
#pragma once

#include <cstddef>
#include <cstdint>

namespace zero {

// dst[i] = src[0][i] + src[1][i] + ... + src[n-1][i], added in that order, for i in [0, count). `dtype` is
// ZERO_DTYPE_FP32, _BF16 or _FP16; 16-bit values are summed in fp32 and rounded once to nearest even. `dst` may be
// one of the sources (the sums are stored after they are complete, chunk by chunk).
void sum_in_rank_order(void* dst, const void* const* src, int n, size_t count, int32_t dtype);

// The same sum continued from a partial one, so that it can be computed in pieces on different ranks with the
// same bits (the MPI module's hierarchical reduce-scatter: each node adds its ranks to the sum of the nodes before
// it). `partial`: count fp32 sums of the sources before src[0] (null: src[0] is the first source). With
// `dst_is_partial` the sums are stored as fp32, unrounded, to be continued; otherwise in `dtype`, as
// sum_in_rank_order stores them. n may be 0 when `partial` is given.
void sum_in_rank_order_from(void* dst, bool dst_is_partial, const float* partial, const void* const* src, int n,
                            size_t count, int32_t dtype);

// `buf` holds `n` blocks of `block` elements of `dtype`, one per rank. Block `into` becomes their element-wise sum
// (sum_in_rank_order). The other blocks are left as they are.
void sum_blocks_in_rank_order(void* buf, size_t block, int n, int into, int32_t dtype);

}  // namespace zero
