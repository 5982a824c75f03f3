// The rank-order sum continued from a partial one (core/comm/rank_order_sum.hpp): cutting the sources anywhere,
// summing the first part into fp32 partial sums and continuing from them gives the bits of one sum over all of them
// — what the MPI module's hierarchical reduce-scatter relies on to match every other path. Values of many
// magnitudes and signs (so the order of the additions shows in the bits), signed zeros, and 16-bit sums that are
// rounded only at the end.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "comm/rank_order_sum.hpp"
#include "numeric/dtype.hpp"

namespace zero {
namespace {

std::vector<uint8_t> contribution(int32_t dtype, size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> mant(-1.0f, 1.0f);
  std::uniform_int_distribution<int> expo(-20, 20);
  const size_t esize = dtype == ZERO_DTYPE_FP32 ? 4 : 2;
  std::vector<uint8_t> out(n * esize);
  for (size_t i = 0; i < n; ++i) {
    float v = i % 97 == 0 ? -0.0f : std::ldexp(mant(rng), expo(rng));
    if (dtype == ZERO_DTYPE_FP32) {
      std::memcpy(&out[4 * i], &v, 4);
    } else {
      const uint16_t h = dtype == ZERO_DTYPE_BF16 ? float_to_bf16_rne(v) : float_to_fp16_rne(v);
      std::memcpy(&out[2 * i], &h, 2);
    }
  }
  return out;
}

TEST(RankOrderSum, ContinuingFromAPartialSumGivesTheBitsOfOneSum) {
  for (int32_t dtype : {ZERO_DTYPE_FP32, ZERO_DTYPE_BF16, ZERO_DTYPE_FP16}) {
    const size_t esize = dtype == ZERO_DTYPE_FP32 ? 4 : 2;
    for (size_t n : {size_t{1}, size_t{511}, size_t{512}, size_t{1537}}) {
      for (int ranks : {2, 3, 6}) {
        std::vector<std::vector<uint8_t>> x;
        std::vector<const void*> src;
        for (int r = 0; r < ranks; ++r) x.push_back(contribution(dtype, n, 11u * static_cast<unsigned>(r) + 1u));
        for (const auto& v : x) src.push_back(v.data());
        std::vector<uint8_t> whole(n * esize);
        sum_in_rank_order(whole.data(), src.data(), ranks, n, dtype);
        // Every cut into consecutive pieces: the first from the sources alone, the rest from the partial sums.
        for (int cut = 1; cut < ranks; ++cut) {
          std::vector<float> partial(n);
          sum_in_rank_order_from(partial.data(), true, nullptr, src.data(), cut, n, dtype);
          if (cut + 1 < ranks) {  // one more piece of one source, partial to partial
            sum_in_rank_order_from(partial.data(), true, partial.data(), src.data() + cut, 1, n, dtype);
            std::vector<uint8_t> pieces(n * esize);
            sum_in_rank_order_from(pieces.data(), false, partial.data(), src.data() + cut + 1, ranks - cut - 1, n,
                                   dtype);
            EXPECT_EQ(whole, pieces) << "dtype " << dtype << ", " << n << " elements, " << ranks << " ranks cut after "
                                     << cut << " and " << cut + 1;
          } else {
            std::vector<uint8_t> pieces(n * esize);
            sum_in_rank_order_from(pieces.data(), false, partial.data(), src.data() + cut, ranks - cut, n, dtype);
            EXPECT_EQ(whole, pieces) << "dtype " << dtype << ", " << n << " elements, " << ranks << " ranks cut after "
                                     << cut;
          }
        }
      }
    }
  }
}

TEST(RankOrderSum, ASumOfNodeTotalsWouldRoundDifferently) {
  // Why the hierarchy continues one sum: (a + b) + (c + d) is not ((a + b) + c) + d.
  const float a = 1.0f, b = 0.0f, c = std::ldexp(1.0f, -24), d = std::ldexp(1.0f, -24);
  const void* src[4] = {&a, &b, &c, &d};
  float fold = 0;
  sum_in_rank_order(&fold, src, 4, 1, ZERO_DTYPE_FP32);
  const float left = a + b, right = c + d;
  const float totals = left + right;
  EXPECT_NE(0, std::memcmp(&fold, &totals, 4)) << fold << " vs " << totals;
}

}  // namespace
}  // namespace zero
