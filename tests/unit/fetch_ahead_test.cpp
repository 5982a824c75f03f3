// The stage-3 fetch-ahead decision (core/params/fetch_ahead.hpp) on its own: following the recorded order, losing
// it, reuse at its distance, prefetch up to its window, the live budget in pooled buffers, and the reach into the
// next micro-step of the same window.
#include <gtest/gtest.h>

#include <set>

#include "params/fetch_ahead.hpp"

namespace zero {
namespace {

// Units of 100 elements each, one pooled buffer each.
struct Scenario {
  FetchPolicy policy;
  FetchOrder order;
  std::vector<uint64_t> elems;
  std::set<int> ahead;  // units already fetched, fetching or kept
  uint64_t live = 0;    // in elements
  bool next_in_window = false;

  Scenario(std::vector<int> recorded, size_t units) : elems(units, 100) { order.order = std::move(recorded); }
  AheadPlan at(int unit) const {
    FetchState s;
    s.unit_elems = &elems;
    s.buffer_elems = 100;
    s.live_elements = live;
    s.holds_ahead = [this](int v) { return ahead.count(v) != 0; };
    s.next_in_window = next_in_window;
    return plan_ahead(policy, order, unit, s);
  }
};

TEST(FetchAhead, NothingAheadWithoutPrefetchOrReuse) {
  Scenario s({0, 1, 2, 3}, 4);
  const AheadPlan a = s.at(0);
  EXPECT_EQ(a.cursor, 0u);  // the order is not even followed
  EXPECT_FALSE(a.lost);
  EXPECT_FALSE(a.keep);
  EXPECT_TRUE(a.prefetch.empty());
}

TEST(FetchAhead, PrefetchesTheNextUnitsOfTheOrderWithinItsWindow) {
  Scenario s({0, 1, 2, 3, 4}, 5);
  s.policy.prefetch_elements = 250;  // two units and a half: the third starts inside the window
  s.policy.max_live_elements = 1000;
  const AheadPlan a = s.at(0);
  EXPECT_EQ(a.cursor, 1u);
  EXPECT_EQ(a.prefetch, (std::vector<int>{1, 2, 3}));
}

TEST(FetchAhead, WhatIsAlreadyAheadCountsInTheWindowButIsNotFetchedAgain) {
  Scenario s({0, 1, 2, 3, 4}, 5);
  s.policy.prefetch_elements = 200;
  s.policy.max_live_elements = 1000;
  s.ahead = {1};
  s.live = 100;
  EXPECT_EQ(s.at(0).prefetch, (std::vector<int>{2}));
}

TEST(FetchAhead, TheBudgetCountsPooledBuffersAndStopsThePrefetch) {
  Scenario s({0, 1, 2, 3, 4}, 5);
  s.policy.prefetch_elements = 1000;
  s.policy.max_live_elements = 250;  // two buffers
  EXPECT_EQ(s.at(0).prefetch, (std::vector<int>{1, 2}));
  s.live = 200;  // two buffers already held elsewhere
  EXPECT_TRUE(s.at(0).prefetch.empty());
}

TEST(FetchAhead, AUnitTakenNowIsNoLongerHeld) {
  Scenario s({0, 1, 2}, 3);
  s.policy.prefetch_elements = 1000;
  s.policy.max_live_elements = 100;  // one buffer
  s.ahead = {0};                     // unit 0 was prefetched: gathering it frees its place in the budget
  s.live = 100;
  EXPECT_EQ(s.at(0).prefetch, (std::vector<int>{1}));
}

TEST(FetchAhead, AGatherFurtherOnSkipsUnitsAndOneNotAheadLosesTheOrder) {
  Scenario s({0, 1, 2, 3}, 5);
  s.policy.prefetch_elements = 100;
  s.policy.max_live_elements = 1000;
  s.order.cursor = 1;
  AheadPlan a = s.at(3);  // units 1 and 2 skipped this time
  EXPECT_FALSE(a.lost);
  EXPECT_EQ(a.cursor, 4u);
  EXPECT_TRUE(a.prefetch.empty());  // the order ends here (no next micro-step in this window)
  a = s.at(4);                      // the order does not have unit 4 ahead
  EXPECT_TRUE(a.lost);
  EXPECT_TRUE(a.prefetch.empty());
  s.order.lost = true;  // once lost, nothing is fetched ahead until the micro-step ends
  a = s.at(2);
  EXPECT_TRUE(a.lost);
  EXPECT_TRUE(a.prefetch.empty());
}

TEST(FetchAhead, ReuseKeepsAUnitNeededAgainWithinItsDistance) {
  // Backward starts with forward's last unit: 0 1 2 | 2 1 0.
  Scenario s({0, 1, 2, 2, 1, 0}, 3);
  s.policy.max_reuse_distance = 1;  // keep only a unit gathered again next
  s.policy.max_live_elements = 1000;
  s.order.cursor = 2;
  EXPECT_TRUE(s.at(2).keep);
  s.order.cursor = 1;
  EXPECT_FALSE(s.at(1).keep);  // unit 2 twice in between
  s.policy.max_reuse_distance = 201;
  EXPECT_TRUE(s.at(1).keep);
  s.policy.max_live_elements = 0;  // no buffer to keep it in
  EXPECT_FALSE(s.at(1).keep);
}

TEST(FetchAhead, TheNextMicroStepOfTheWindowIsAheadToo) {
  Scenario s({0, 1, 2}, 3);
  s.policy.prefetch_elements = 200;
  s.policy.max_live_elements = 1000;
  s.order.cursor = 2;
  EXPECT_TRUE(s.at(2).prefetch.empty());
  s.next_in_window = true;  // the params stay the same: the next micro-step's first units are worth fetching
  EXPECT_EQ(s.at(2).prefetch, (std::vector<int>{0, 1}));
  s.policy.max_reuse_distance = 1000;  // ... and one whole cycle later the unit itself comes back: kept
  EXPECT_TRUE(s.at(2).keep);
}

}  // namespace
}  // namespace zero
