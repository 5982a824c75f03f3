// The pieces of a micro-step that are pure state: a unit's gather state and its transitions
// (core/params/unit.hpp), and when buckets reduce (core/grads/bucket_readiness.hpp).
#include <gtest/gtest.h>

#include "grads/bucket.hpp"
#include "params/unit.hpp"
#include "util/error.hpp"

namespace zero {
namespace {

using State = Unit::GatherState;

TEST(UnitGatherState, FullParamsAreGatheredInPlaceAndPublished) {
  Unit u;
  u.start(false);
  EXPECT_EQ(u.gather_state(), State::kResident);
  u.start_publish();
  EXPECT_TRUE(u.fetch_in_flight());
  EXPECT_FALSE(u.holds_ahead());  // the params' own buffer, not a pooled one
  u.fetch_done();
  u.gather_resident();
  EXPECT_EQ(u.gather_state(), State::kGathered);
  EXPECT_EQ(u.generation(), 1u);
  EXPECT_EQ(u.release(), nullptr);  // nothing goes back to the pool
  EXPECT_EQ(u.gather_state(), State::kResident);
  EXPECT_EQ(u.generation(), 2u);
}

TEST(UnitGatherState, APrefetchedUnitIsTakenWithoutCommunicating) {
  Unit u;
  u.start(true);
  int buffer = 0;
  EXPECT_EQ(u.take_fetched(), nullptr);  // nothing fetched: the caller all-gathers
  u.start_fetch(&buffer);
  EXPECT_EQ(u.gather_state(), State::kFetching);
  EXPECT_TRUE(u.holds_ahead());
  EXPECT_EQ(u.fetch_buffer(), &buffer);
  EXPECT_THROW(u.take_fetched(), Error);  // still in flight: complete it first
  u.fetch_done();
  EXPECT_EQ(u.take_fetched(), &buffer);
  u.gathered_into(&buffer, false);
  EXPECT_EQ(u.view(), &buffer);
  EXPECT_EQ(u.release(), &buffer);  // back to the pool
  EXPECT_EQ(u.gather_state(), State::kSharded);
}

TEST(UnitGatherState, AKeptUnitKeepsItsBufferAheadOfTheNextGather) {
  Unit u;
  u.start(true);
  int buffer = 0;
  u.gathered_into(&buffer, true);
  EXPECT_EQ(u.gather_state(), State::kKept);
  EXPECT_TRUE(u.holds_ahead());
  EXPECT_EQ(u.release(), nullptr);
  EXPECT_EQ(u.gather_state(), State::kFetched);
  EXPECT_EQ(u.settle(), &buffer);  // a step gives it back
  EXPECT_EQ(u.gather_state(), State::kSharded);
}

TEST(UnitGatherState, AGatheredUnitsNextUseMayBeFetchedIntoASecondBuffer) {
  Unit u;
  u.start(true);
  int first = 0, second = 0;
  u.gathered_into(&first, false);
  u.start_fetch(&second);  // decided alike on every rank, while this one still holds the unit
  EXPECT_TRUE(u.fetch_in_flight());
  EXPECT_TRUE(u.holds_ahead());
  EXPECT_THROW(u.start_fetch(&second), Error);  // one next use at a time
  EXPECT_EQ(u.release(), &first);               // the held buffer goes back, the fetched one is ahead
  EXPECT_EQ(u.gather_state(), State::kFetching);
  u.fetch_done();
  EXPECT_EQ(u.take_fetched(), &second);
}

TEST(UnitGatherState, TransitionsFromTheWrongStateAreInternalErrors) {
  Unit u;
  u.start(true);
  EXPECT_THROW(u.release(), Error);
  EXPECT_THROW(u.gather_resident(), Error);
  EXPECT_THROW(u.start_publish(), Error);
  EXPECT_THROW(u.fetch_done(), Error);
  int buffer = 0;
  u.start_fetch(&buffer);
  EXPECT_THROW(u.settle(), Error);  // a fetch in flight must complete first
  try {
    u.gathered_into(&buffer, false);
    FAIL() << "a fetching unit was gathered";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), ZERO_ERR_INTERNAL);
    EXPECT_NE(std::string(e.what()).find("fetching"), std::string::npos) << e.what();
  }
}

TEST(BucketReadiness, ABucketReducesWhenEveryParamItExpectsIsReady) {
  EXPECT_EQ(turn_in_backward({3, 2}), BucketTurn::kWait);
  EXPECT_EQ(turn_in_backward({3, 3}), BucketTurn::kReduce);
  EXPECT_EQ(turn_in_backward({0, 0}), BucketTurn::kPass);  // expects nothing: passed over
  EXPECT_EQ(turn_at_backward_end({3, 1}), BucketTurn::kReduce);
  EXPECT_EQ(turn_at_backward_end({0, 0}), BucketTurn::kPass);
}

TEST(BucketReadiness, AfterAMicroStepEveryRankReducesTheSameBucketsAgainAndExpectsTheParamsThatHadGradients) {
  // 5 params in 2 buckets (params 0-2 in bucket 0, 3-4 in bucket 1), 3 ranks.
  const std::vector<int> bucket_of = {0, 0, 0, 1, 1};
  std::vector<uint64_t> all;
  // rank 0: params 0, 1 had gradients; rank 1: param 3, and bucket 1 holds one that came late; rank 2: nothing.
  for (const auto& [touched, holding] : std::vector<std::pair<std::vector<char>, std::vector<char>>>{
           {{1, 1, 0, 0, 0}, {0, 0}}, {{0, 0, 0, 1, 0}, {0, 1}}, {{0, 0, 0, 0, 0}, {0, 0}}}) {
    const std::vector<uint64_t> bits = micro_step_bits(touched, holding);
    ASSERT_EQ(bits.size(), micro_step_words(5, 2));
    all.insert(all.end(), bits.begin(), bits.end());
  }
  const MicroStepOutcome out = after_micro_step(all, 3, 5, bucket_of, 2);
  EXPECT_EQ(out.reduce_again, std::vector<int>{1});
  EXPECT_EQ(out.param_expected, (std::vector<char>{1, 1, 0, 1, 0}));
  EXPECT_EQ(out.bucket_expected, (std::vector<size_t>{2, 1}));
}

TEST(BucketReadiness, TheBitmapsSpanWordsWhenThereAreManyParams) {
  std::vector<char> touched(130, 0), holding(3, 0);
  touched[64] = touched[129] = 1;
  holding[2] = 1;
  const std::vector<uint64_t> bits = micro_step_bits(touched, holding);
  ASSERT_EQ(bits.size(), 3u);
  std::vector<int> bucket_of(130, 0);
  bucket_of[129] = 2;
  const MicroStepOutcome out = after_micro_step(bits, 1, 130, bucket_of, 3);
  EXPECT_EQ(out.reduce_again, std::vector<int>{2});
  EXPECT_EQ(out.bucket_expected, (std::vector<size_t>{1, 0, 1}));
}

}  // namespace
}  // namespace zero
