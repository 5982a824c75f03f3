// Element conversions between the gradient, communication and compute dtypes.
#pragma once

#include <cstddef>

#include "numeric/dtype.hpp"

namespace zero {

// dst[i] = src[i] converted (round to nearest even when narrowing), for i in [0, n). The ranges may overlap as an
// in-place conversion does (dst == src), or when dst lies entirely after src.
void convert(void* dst, DType dst_type, const void* src, DType src_type, size_t n);

// acc[i] = acc[i] + src[i], computed in fp32 and rounded to acc's dtype.
void accumulate(void* acc, DType acc_type, const void* src, DType src_type, size_t n);

// acc[i] = 0 + src[i], computed in fp32 and rounded to acc's dtype: the bits accumulate() gives on a zeroed acc
// (-0 becomes +0 as it does there), without reading acc — the first accumulation into a buffer not cleared.
void accumulate_into_zero(void* acc, DType acc_type, const void* src, DType src_type, size_t n);

// dst[i] = the compute-dtype rounding of the fp32 src[i] (round to nearest even).
void round_from_f32(void* dst, DType dst_type, const float* src, size_t n);

}  // namespace zero
