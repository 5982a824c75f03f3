// A reduction's adds into a unit's accumulator piece by piece (grads/accumulator.hpp's AccumulatorPieces): handed
// the pieces' sources in any cut and in the window's cuts (summed there in one pass, or through its scratch) and the
// rest from the reduced block after the wait, it leaves the accumulator and the norm's segment squares with the bits
// the whole block's accumulate gives — the window's first reduction (written, streamed when large) and a later one
// (added), fp32, bf16 and fp16 communication, 1-3 ranks, norm segments with gaps, blocks that span pieces. Beneath
// it, on every instruction set: reduce_into (the one pass) against the sum, the add and the norm's kernel, special
// values included; streaming into zero against accumulating into zero; and the squares' carry, whose pieces in any
// cut give sum_squares over the whole run.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "comm/rank_order_sum.hpp"
#include "grads/accumulator.hpp"
#include "kernels/kernels.hpp"
#include "numeric/dtype.hpp"

namespace zero {
namespace {

std::vector<char> random_values(size_t n, DType dtype, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> value(0.0f, 1.0f);
  std::vector<char> out(n * dtype_size(dtype));
  for (size_t i = 0; i < n; ++i) {
    const float v = value(gen) * static_cast<float>(1 + i % 7);
    if (dtype == DType::kF32) {
      std::memcpy(out.data() + i * 4, &v, 4);
    } else {
      const uint16_t h = dtype == DType::kBF16 ? float_to_bf16_rne(v) : float_to_fp16_rne(v);
      std::memcpy(out.data() + i * 2, &h, 2);
    }
  }
  return out;
}

uint64_t bits_of(double x) {
  uint64_t b;
  std::memcpy(&b, &x, sizeof b);
  return b;
}

TEST(SquaresCarry, PiecesInAnyCutGiveTheWholeRunsBits) {
  std::mt19937 gen(5);
  for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512}) {
    if (!isa_supported(isa)) continue;
    const KernelTable& k = kernels(isa);
    for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16})
      for (size_t n : {size_t{0}, size_t{1}, size_t{15}, size_t{16}, size_t{17}, size_t{1000}, size_t{70001}}) {
        SCOPED_TRACE("isa " + std::to_string(static_cast<int>(isa)) + ", dtype " +
                     std::to_string(static_cast<int>(dtype)) + ", n " + std::to_string(n));
        const std::vector<char> values = random_values(n, dtype, static_cast<uint32_t>(n) + 1);
        const int d = static_cast<int>(dtype);
        const double whole = k.sum_squares[d](values.data(), n);
        for (size_t largest : {size_t{1}, size_t{7}, size_t{40}, size_t{5000}}) {
          std::uniform_int_distribution<size_t> cut(1, largest);
          SquaresCarry carry;
          for (size_t at = 0; at < n;) {
            const size_t m = std::min(cut(gen), n - at);
            k.squares_more[d](carry, values.data() + at * dtype_size(dtype), m);
            at += m;
          }
          EXPECT_EQ(bits_of(whole), bits_of(k.squares_end[d](carry))) << "pieces of at most " << largest;
          EXPECT_EQ(bits_of(whole), bits_of(k.squares_end[d](carry) + whole)) << "the carry starts afresh";
        }
      }
  }
}

// Non-temporal stores change where the lines go, never a value: the same bits as accumulate_into_zero (0 + x: a
// negative zero becomes positive) for every source dtype, destination alignment and length, specials included.
TEST(ReduceInto, StreamingIntoZeroStoresWhatAccumulatingIntoZeroStores) {
  std::mt19937 gen(11);
  std::uniform_real_distribution<float> value(-3.0f, 3.0f);
  const size_t n = 1000;
  std::vector<float> f32(n);
  std::vector<uint16_t> bf16(n), fp16(n);
  for (size_t i = 0; i < n; ++i) f32[i] = value(gen);
  f32[3] = -0.0f, f32[100] = std::numeric_limits<float>::infinity(), f32[200] = std::nanf(""), f32[301] = 1e-40f;
  for (size_t i = 0; i < n; ++i) bf16[i] = float_to_bf16_rne(f32[i]), fp16[i] = float_to_fp16_rne(f32[i]);
  const void* sources[3] = {f32.data(), bf16.data(), fp16.data()};
  for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512}) {
    if (!isa_supported(isa)) continue;
    const KernelTable& k = kernels(isa);
    for (int dtype = 0; dtype < 3; ++dtype)
      for (size_t offset : {0, 1, 5, 8, 15})
        for (size_t len : {size_t{0}, size_t{3}, size_t{16}, size_t{17}, size_t{64}, n - offset}) {
          SCOPED_TRACE("isa " + std::to_string(static_cast<int>(isa)) + ", dtype " + std::to_string(dtype) +
                       ", offset " + std::to_string(offset) + ", length " + std::to_string(len));
          std::vector<float> streamed(n + 32, 7.0f), stored(n + 32, 7.0f);
          const char* src = static_cast<const char*>(sources[dtype]) + offset * (dtype == 0 ? 4 : 2);
          // The destination offset by `offset` floats from a 64-byte boundary.
          float* a = streamed.data() + (16 - reinterpret_cast<uintptr_t>(streamed.data()) / 4 % 16) % 16 + offset;
          float* b = stored.data() + (16 - reinterpret_cast<uintptr_t>(stored.data()) / 4 % 16) % 16 + offset;
          k.stream_into_zero[dtype](a, src, len);
          k.accumulate_into_zero[dtype](b, src, len);
          ASSERT_EQ(std::memcmp(a, b, len * 4), 0);
          ASSERT_EQ(a[len], 7.0f);  // nothing past the end
          if (a != streamed.data()) {
            ASSERT_EQ(a[-1], 7.0f);
          }
        }
  }
}

// Values whose sums test the arithmetic's corners, at the same places in every source: zeros of both signs, infinities
// of opposite signs (a NaN), a NaN with a payload, a subnormal, and values whose 16-bit sum overflows. One payload in
// every source: which of two NaNs an addition returns follows its operand order, which C++ lets the compiler swap
// (the engine promises a NaN where one is, not its payload).
void put_specials(std::vector<char>& v, DType dtype, int rank) {
  const float inf = std::numeric_limits<float>::infinity();
  const uint32_t payload = 0x7fc00001u;
  float nan;
  std::memcpy(&nan, &payload, sizeof nan);
  const float specials[] = {-0.0f, rank == 0 ? 0.0f : -0.0f, rank % 2 ? -inf : inf, nan, 1e-40f, 60000.0f, -3e38f};
  for (size_t k = 0; k < sizeof specials / sizeof specials[0]; ++k) {
    const size_t at = 3 + 17 * k;
    if (dtype == DType::kF32) {
      std::memcpy(v.data() + at * 4, &specials[k], 4);
    } else {
      const uint16_t h = dtype == DType::kBF16 ? float_to_bf16_rne(specials[k]) : float_to_fp16_rne(specials[k]);
      std::memcpy(v.data() + at * 2, &h, 2);
    }
  }
}

// One pass from the sources: the sum as the backends make it, added as accumulate adds it, streamed or stored, and
// the squares as the norm's kernel takes them, on every instruction set, for 1-3 sources of each dtype.
TEST(ReduceInto, OnePassFromTheSourcesGivesTheSumTheAddsAndTheSquares) {
  const size_t count = 1024 + 48;
  for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512}) {
    if (!isa_supported(isa)) continue;
    const KernelTable& k = kernels(isa);
    for (DType comm : {DType::kF32, DType::kBF16, DType::kF16})
      for (int n : {1, 2, 3})
        for (bool into_zero : {true, false})
          for (bool stream : {false, true}) {
            if (stream && !into_zero) continue;
            SCOPED_TRACE("isa " + std::to_string(static_cast<int>(isa)) + ", dtype " +
                         std::to_string(static_cast<int>(comm)) + ", " + std::to_string(n) + " sources" +
                         (into_zero ? ", written" : ", added") + (stream ? ", streamed" : ""));
            std::vector<std::vector<char>> sources;
            std::vector<const void*> from;
            for (int r = 0; r < n; ++r) {
              sources.push_back(random_values(count, comm, 40 + static_cast<uint32_t>(r)));
              put_specials(sources.back(), comm, r);
            }
            for (const std::vector<char>& v : sources) from.push_back(v.data());
            std::vector<char> sum(count * dtype_size(comm));
            sum_in_rank_order(sum.data(), from.data(), n, count, static_cast<int32_t>(comm));
            const std::vector<char> before = random_values(count, DType::kF32, 77);
            alignas(64) static float expected[count], got[count];
            std::memcpy(expected, before.data(), sizeof expected);
            std::memcpy(got, before.data(), sizeof got);
            const int d = static_cast<int>(comm);
            (into_zero ? k.accumulate_into_zero : k.accumulate)[d](expected, sum.data(), count);
            SquaresCarry carry;
            k.reduce_into[d](got, from.data(), n, count, into_zero, stream, &carry);
            ASSERT_EQ(0, std::memcmp(expected, got, sizeof got));
            EXPECT_EQ(bits_of(k.sum_squares[0](expected, count)), bits_of(k.squares_end[0](carry)));
            std::memcpy(got, before.data(), sizeof got);
            k.reduce_into[d](got, from.data(), n, count, into_zero, stream, nullptr);
            ASSERT_EQ(0, std::memcmp(expected, got, sizeof got)) << "without squares";
          }
  }
}

struct AccumulatorCase {
  DType comm;
  int ranks;
  bool earlier_reduction;  // a reduction of the window before this one (this one adds)
  size_t elems;
  bool window_cuts;  // pieces as the window cuts them (whole 64-byte lines; an aligned accumulator), else any cut
};

// The shard's norm segments: a short one at the start, one that spans a block boundary, one of several blocks,
// with gaps between them and after the last.
std::vector<ShardSegment> segments_of(size_t elems) {
  std::vector<ShardSegment> s;
  const size_t third = elems / 3;
  s.push_back({0, 100, 0, 0});
  s.push_back({128, third - 200, 1, 0});
  s.push_back({third + 64, elems - third - 64 - 37, 2, 0});
  return s;
}

void check_pieces(const AccumulatorCase& c, uint32_t seed) {
  SCOPED_TRACE("comm dtype " + std::to_string(static_cast<int>(c.comm)) + ", ranks " + std::to_string(c.ranks) +
               (c.earlier_reduction ? ", adding" : ", first reduction") + ", " + std::to_string(c.elems) + " elements" +
               (c.window_cuts ? ", the window's cuts" : ", any cut"));
  const size_t esize = dtype_size(c.comm);
  std::vector<std::vector<char>> sources;
  std::vector<const void*> from;
  for (int r = 0; r < c.ranks; ++r) sources.push_back(random_values(c.elems, c.comm, seed + static_cast<uint32_t>(r)));
  for (const std::vector<char>& s : sources) from.push_back(s.data());
  std::vector<char> reduced(c.elems * esize);
  sum_in_rank_order(reduced.data(), from.data(), c.ranks, c.elems, static_cast<int32_t>(c.comm));
  const std::vector<char> earlier = random_values(c.elems, c.comm, seed + 100);
  const std::vector<ShardSegment> segments = segments_of(c.elems);

  std::vector<float> expected_acc(c.elems, 5.0f), got_storage(c.elems + 16, 5.0f);
  // 64-byte aligned for the window's cuts; one float past a line otherwise (the fused pass then declines).
  float* got_acc = got_storage.data() + (16 - reinterpret_cast<uintptr_t>(got_storage.data()) / 4 % 16) % 16 +
                   (c.window_cuts ? 0 : 1);
  GradientView expected_view{expected_acc.data(), DType::kF32, MemorySpace::kHost, c.elems};
  GradientView got_view{got_acc, DType::kF32, MemorySpace::kHost, c.elems};
  UnitAccumulator expected(expected_view, segments, 0, true, c.comm), got(got_view, segments, 0, true, c.comm);
  if (c.earlier_reduction) {
    expected.accumulate(earlier.data(), MemorySpace::kHost, false);
    got.accumulate(earlier.data(), MemorySpace::kHost, false);
  }
  expected.accumulate(reduced.data(), MemorySpace::kHost, true);

  // The sources of about two thirds of the block in pieces of every size, then the rest from the block.
  AccumulatorPieces pieces;
  got.begin_reduction(pieces, true, reduced.data(), true);
  std::mt19937 gen(seed);
  std::uniform_int_distribution<size_t> cut(1, 40000);
  const size_t line = 64 / esize;
  for (size_t at = 0; at < c.elems * 2 / 3;) {
    const size_t m = std::min(c.window_cuts ? (cut(gen) + line - 1) / line * line : cut(gen), c.elems - at);
    std::vector<const void*> piece;
    for (const std::vector<char>& s : sources) piece.push_back(s.data() + at * esize);
    ASSERT_TRUE(pieces.take_sources(piece.data(), c.ranks, static_cast<int32_t>(c.comm), at, m));
    at += m;
  }
  pieces.finish();
  ASSERT_EQ(0, std::memcmp(expected_acc.data(), got_acc, c.elems * 4)) << "the accumulator";
  ASSERT_NE(nullptr, expected.folded_squares());
  ASSERT_NE(nullptr, got.folded_squares());
  for (size_t i = 0; i < segments.size(); ++i)
    EXPECT_EQ(bits_of(expected.folded_squares()[i]), bits_of(got.folded_squares()[i])) << "segment " << i;
}

TEST(AccumulatorPieces, SourcesSummedInPiecesGiveTheWholeBlocksBits) {
  uint32_t seed = 1;
  // 300001 fp32 elements pass kStreamMinBytes (the first reduction streams); 20001 do not.
  for (size_t elems : {size_t{20001}, size_t{300001}})
    for (DType comm : {DType::kF32, DType::kBF16, DType::kF16})
      for (int ranks : {1, 2, 3})
        for (bool earlier : {false, true})
          for (bool window_cuts : {false, true}) check_pieces({comm, ranks, earlier, elems, window_cuts}, seed++);
}

// Pieces out of order are left to the block (a backend that broke the contract), and a disarmed sink takes nothing:
// the backend then sums into the buffer itself.
TEST(AccumulatorPieces, OutOfOrderPiecesAndADisarmedSinkAreDeclined) {
  const size_t elems = 1000;
  std::vector<char> a = random_values(elems, DType::kF32, 1), b = random_values(elems, DType::kF32, 2);
  const std::vector<ShardSegment> segments = segments_of(elems);
  std::vector<float> acc(elems);
  UnitAccumulator unit(GradientView{acc.data(), DType::kF32, MemorySpace::kHost, elems}, segments, 0, true,
                       DType::kF32);
  AccumulatorPieces pieces;
  unit.begin_reduction(pieces, true, a.data(), true);
  const void* sources[2] = {a.data() + 400, b.data() + 400};
  EXPECT_FALSE(pieces.take_sources(sources, 2, ZERO_DTYPE_FP32, 100, 10));  // not at the next element
  EXPECT_FALSE(pieces.take_sources(sources, 2, ZERO_DTYPE_BF16, 0, 10));    // another dtype
  pieces.disarm();
  const void* first[2] = {a.data(), b.data()};
  EXPECT_FALSE(pieces.take_sources(first, 2, ZERO_DTYPE_FP32, 0, 10));
}

}  // namespace
}  // namespace zero
