#include "comm/rank_order_sum.hpp"

#include <algorithm>
#include <cstring>

#include "dtype.hpp"

namespace zero {

// Works through the blocks in chunks: each chunk's sums are built in a small local array, pass by pass in rank
// order (so the passes vectorise), then stored into block `into`, which is itself one of the inputs.
void sum_blocks_in_rank_order(void* buf, size_t block, int n, int into, int32_t dtype) {
  constexpr size_t kChunk = 512;
  char* base = static_cast<char*>(buf);
  const size_t esize = (dtype == ZERO_DTYPE_FP32 ? 4 : 2), block_bytes = block * esize;
  const bool bf16 = dtype == ZERO_DTYPE_BF16;
  float sum[kChunk];
  for (size_t begin = 0; begin < block; begin += kChunk) {
    const size_t m = std::min(kChunk, block - begin);
    for (int k = 0; k < n; ++k) {
      const char* src = base + static_cast<size_t>(k) * block_bytes + begin * esize;
      if (dtype == ZERO_DTYPE_FP32) {
        const float* f = reinterpret_cast<const float*>(src);
        if (k == 0)
          for (size_t i = 0; i < m; ++i) sum[i] = f[i];
        else
          for (size_t i = 0; i < m; ++i) sum[i] += f[i];
      } else {
        const uint16_t* h = reinterpret_cast<const uint16_t*>(src);
        for (size_t i = 0; i < m; ++i) {
          const float v = bf16 ? bf16_to_float(h[i]) : fp16_to_float(h[i]);
          sum[i] = k == 0 ? v : sum[i] + v;
        }
      }
    }
    char* dst = base + static_cast<size_t>(into) * block_bytes + begin * esize;
    if (dtype == ZERO_DTYPE_FP32) {
      std::memcpy(dst, sum, m * sizeof(float));
    } else {
      uint16_t* h = reinterpret_cast<uint16_t*>(dst);
      for (size_t i = 0; i < m; ++i) h[i] = bf16 ? float_to_bf16_rne(sum[i]) : float_to_fp16_rne(sum[i]);
    }
  }
}

}  // namespace zero
