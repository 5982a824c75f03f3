#include <gtest/gtest.h>

#include <climits>

#include "../../backends/mpi/message_blocks.hpp"
#include "plan/layout.hpp"
#include "util/error.hpp"

namespace zero {
namespace {

std::vector<ParamShape> uneven_model() {
  // Sizes chosen so that shards cut through params, some params are smaller than the rank count and the unit
  // sizes are not divisible by 3.
  return {{"a", {37, 5}, 0, 0}, {"b", {1}, 0, 1},     {"c", {13, 7}, 1, 0}, {"d", {3}, 1, 1},
          {"e", {2}, 1, 1},     {"f", {7, 11}, 2, 0}, {"g", {5}, 2, 1},     {"h", {129}, 2, 0}};
}

TEST(Layout, ParamsAreAlignedAndUnitsPaddedToEqualShards) {
  auto params = uneven_model();
  for (int world = 1; world <= 5; ++world) {
    Layout l = build_layout(params, world);
    ASSERT_EQ(l.units.size(), 3u);
    EXPECT_EQ(l.params[0].offset, 0u);
    EXPECT_EQ(l.params[1].offset, 192u);  // 185 rounded up to 64
    EXPECT_EQ(l.units[0].used_elems, 193u);
    EXPECT_EQ(l.params[7].offset, 192u);  // f: 0..77, g: 128..133, h: 192..321
    for (const auto& u : l.units) {
      EXPECT_EQ(u.padded_elems % (16u * world), 0u);
      EXPECT_GE(u.padded_elems, u.used_elems);
      EXPECT_LT(u.padded_elems - u.used_elems, 16u * world);
      EXPECT_EQ(u.shard_elems * world, u.padded_elems);
    }
  }
}

// Over all ranks, the shard segments cover every element of every param exactly once and no padding.
TEST(Layout, SegmentsPartitionEveryParamExactlyOnce) {
  auto params = uneven_model();
  for (int world = 1; world <= 5; ++world) {
    Layout l = build_layout(params, world);
    std::vector<std::vector<int>> seen(params.size());
    for (size_t p = 0; p < params.size(); ++p) seen[p].assign(params[p].numel(), 0);
    for (int u = 0; u < 3; ++u) {
      size_t shard = l.units[u].shard_elems;
      for (int r = 0; r < world; ++r) {
        for (const ShardSegment& s : l.segments(u, r * shard, shard, params)) {
          EXPECT_EQ(s.group, params[s.param].group);
          EXPECT_LE(s.shard_offset + s.numel, shard);
          size_t first = r * shard + s.shard_offset - l.params[s.param].offset;
          for (size_t i = 0; i < s.numel; ++i) seen[s.param][first + i] += 1;
        }
      }
    }
    for (size_t p = 0; p < params.size(); ++p)
      for (size_t i = 0; i < seen[p].size(); ++i) ASSERT_EQ(seen[p][i], 1) << "param " << p << " elem " << i;
  }
}

TEST(Layout, EmptyUnitIsAnError) {
  std::vector<ParamShape> params = {{"a", {4}, 0, 0}, {"b", {4}, 2, 0}};
  try {
    build_layout(params, 2);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), ZERO_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(e.what()).find("unit 1 has no params"), std::string::npos) << e.what();
  }
}

TEST(Layout, BucketsFillInBackwardOrder) {
  auto params = uneven_model();
  Layout l = build_layout(params, 2);  // padded units: 224, 224, 352
  ASSERT_EQ(l.units[0].padded_elems, 224u);
  ASSERT_EQ(l.units[1].padded_elems, 224u);
  ASSERT_EQ(l.units[2].padded_elems, 352u);
  auto b = build_buckets(l, 450);
  ASSERT_EQ(b.size(), 2u);
  EXPECT_EQ(b[0].units, (std::vector<int>{2}));
  EXPECT_EQ(b[1].units, (std::vector<int>{1, 0}));
  EXPECT_EQ(b[1].unit_offsets, (std::vector<size_t>{0, 224}));
  EXPECT_EQ(b[1].elems, 448u);
  // A bucket smaller than a unit still holds that unit, alone.
  b = build_buckets(l, 1);
  ASSERT_EQ(b.size(), 3u);
  for (const auto& bucket : b) EXPECT_EQ(bucket.units.size(), 1u);
  // A large bucket holds everything.
  b = build_buckets(l, 500000000);
  ASSERT_EQ(b.size(), 1u);
  EXPECT_EQ(b[0].elems, 800u);
}

// Units of any size up to 2^56 elements: shards stay 16-aligned, and a shard above MPI's int count is a multiple of
// a power of two that brings it under (the MPI module sends it as blocks of that many), for a padding below one
// block per rank.
TEST(Layout, HugeShardsCanBeSentInBlocksUnderMpisIntCount) {
  EXPECT_EQ(shard_elems_for(321, 2), 176u);  // the ordinary rule: ceil(321 / 2) rounded up to 16
  for (uint64_t used : {uint64_t{INT_MAX} + 1, (uint64_t{1} << 32) + 12345, (uint64_t{1} << 40) + 7,
                        (uint64_t{1} << 50) + 3, kMaxModelElems}) {
    for (int world : {1, 2, 3, 7, 1024}) {
      const uint64_t shard = shard_elems_for(used, world);
      EXPECT_EQ(shard % kShardAlignElems, 0u);
      EXPECT_GE(shard * world, used);
      const uint64_t block = message_block(shard, INT_MAX);
      ASSERT_NE(block, 0u) << used << " over " << world;
      EXPECT_LE(shard / block, uint64_t{INT_MAX});
      const uint64_t minimal = (used + world - 1) / world;
      EXPECT_LT(shard - minimal, std::max<uint64_t>(block, kShardAlignElems)) << used << " over " << world;
    }
  }
}

TEST(Layout, MessageBlocks) {
  EXPECT_EQ(message_block(100, 100), 1u);
  EXPECT_EQ(message_block(101, 100), 0u);  // odd: no power of two divides it
  EXPECT_EQ(message_block(176, 64), 4u);   // 176 = 11 x 16: blocks of 4 give 44
  EXPECT_EQ(message_block(uint64_t{1} << 40, INT_MAX), uint64_t{1} << 10);
  EXPECT_EQ(message_block(0, 0), 1u);
}

// Shapes whose element count overflows are errors, never a wrapped-around small param.
TEST(Layout, OverflowingShapesAreErrors) {
  const ParamShape huge{"w", {int64_t{1} << 32, int64_t{1} << 32}, 0, 0};
  EXPECT_EQ(huge.numel(), SIZE_MAX);
  EXPECT_THROW(build_layout({huge}, 2), Error);
  // Two params each within the limit whose unit is not.
  const ParamShape half{"a", {int64_t{1} << 55, 1}, 0, 0}, other{"b", {int64_t{1} << 55, 1}, 0, 0};
  EXPECT_THROW(build_layout({half, other, other}, 1), Error);
  // A unit id far beyond the params is an error before anything is sized by it.
  const ParamShape stray{"w", {4}, INT_MAX, 0};
  EXPECT_THROW(build_layout({stray}, 2), Error);
}

}  // namespace
}  // namespace zero
