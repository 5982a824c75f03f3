#include "comm/rank_order_sum.hpp"

#include <algorithm>
#include <cstring>
#include <vector>

#include "numeric/dtype.hpp"

namespace zero {

// Works in chunks: each chunk's sums are built in a small local array, pass by pass in rank order (so the passes
// vectorise), then stored into dst, which may itself be one of the inputs. A sum starts as its first source's value
// (not as 0 + it: the sign of a zero survives) or as the partial sum it continues, and every later source is one
// fp32 addition, so cutting the sources anywhere and continuing from the cut gives the same bits.
void sum_in_rank_order_from(void* dst, bool dst_is_partial, const float* partial, const void* const* src, int n,
                            size_t count, int32_t dtype) {
  constexpr size_t kChunk = 512;
  const size_t esize = dtype == ZERO_DTYPE_FP32 ? 4 : 2;
  const bool bf16 = dtype == ZERO_DTYPE_BF16;
  float sum[kChunk];
  for (size_t begin = 0; begin < count; begin += kChunk) {
    const size_t m = std::min(kChunk, count - begin);
    if (partial != nullptr) std::memcpy(sum, partial + begin, m * sizeof(float));
    for (int k = 0; k < n; ++k) {
      const bool first = k == 0 && partial == nullptr;
      const char* from = static_cast<const char*>(src[k]) + begin * esize;
      if (dtype == ZERO_DTYPE_FP32) {
        const float* f = reinterpret_cast<const float*>(from);
        if (first)
          for (size_t i = 0; i < m; ++i) sum[i] = f[i];
        else
          for (size_t i = 0; i < m; ++i) sum[i] += f[i];
      } else {
        const uint16_t* h = reinterpret_cast<const uint16_t*>(from);
        for (size_t i = 0; i < m; ++i) {
          const float v = bf16 ? bf16_to_float(h[i]) : fp16_to_float(h[i]);
          sum[i] = first ? v : sum[i] + v;
        }
      }
    }
    if (dtype == ZERO_DTYPE_FP32 || dst_is_partial) {
      std::memcpy(static_cast<float*>(dst) + begin, sum, m * sizeof(float));
    } else {
      uint16_t* h = static_cast<uint16_t*>(dst) + begin;
      for (size_t i = 0; i < m; ++i) h[i] = bf16 ? float_to_bf16_rne(sum[i]) : float_to_fp16_rne(sum[i]);
    }
  }
}

void sum_in_rank_order(void* dst, const void* const* src, int n, size_t count, int32_t dtype) {
  sum_in_rank_order_from(dst, false, nullptr, src, n, count, dtype);
}

void sum_blocks_in_rank_order(void* buf, size_t block, int n, int into, int32_t dtype) {
  char* base = static_cast<char*>(buf);
  const size_t block_bytes = block * (dtype == ZERO_DTYPE_FP32 ? 4 : 2);
  std::vector<const void*> src(static_cast<size_t>(n));
  for (int k = 0; k < n; ++k) src[static_cast<size_t>(k)] = base + static_cast<size_t>(k) * block_bytes;
  sum_in_rank_order(base + static_cast<size_t>(into) * block_bytes, src.data(), n, block, dtype);
}

}  // namespace zero
