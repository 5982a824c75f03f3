#include "params/fetch_ahead.hpp"

#include <algorithm>

namespace zero {

AheadPlan plan_ahead(const FetchPolicy& policy, const FetchOrder& recorded, int unit, const FetchState& state) {
  AheadPlan a;
  a.cursor = recorded.cursor;
  a.lost = recorded.lost;
  if (policy.prefetch_elements <= 0 && policy.max_reuse_distance <= 0) return a;
  const std::vector<int>& order = recorded.order;
  if (!a.lost) {
    auto it =
        std::find(order.begin() + static_cast<std::ptrdiff_t>(std::min(a.cursor, order.size())), order.end(), unit);
    if (it == order.end())
      a.lost = true;
    else
      a.cursor = static_cast<size_t>(it - order.begin()) + 1;
  }
  if (a.lost) return a;
  const std::vector<uint64_t>& elems = *state.unit_elems;
  const uint64_t max_live = static_cast<uint64_t>(policy.max_live_elements), buffer = state.buffer_elems;
  uint64_t live = state.live_elements - (state.holds_ahead(unit) ? buffer : 0);  // taken now: not held any more
  const size_t n = order.size(), end = state.next_in_window ? a.cursor + n : n;
  if (policy.max_reuse_distance > 0) {
    uint64_t distance = 0;
    for (size_t j = a.cursor; j < end; ++j) {
      const int v = order[j % n];
      if (v == unit) {
        a.keep = live + buffer <= max_live;
        break;
      }
      distance += elems[static_cast<size_t>(v)];
      if (distance >= static_cast<uint64_t>(policy.max_reuse_distance)) break;
    }
    if (a.keep) live += buffer;
  }
  if (policy.prefetch_elements > 0) {
    uint64_t window = 0;
    for (size_t j = a.cursor; j < end && window < static_cast<uint64_t>(policy.prefetch_elements); ++j) {
      const int v = order[j % n];
      if (v == unit) continue;  // gathered now: reuse decides
      window += elems[static_cast<size_t>(v)];
      if (state.holds_ahead(v) || std::find(a.prefetch.begin(), a.prefetch.end(), v) != a.prefetch.end()) continue;
      if (live + buffer > max_live) break;
      a.prefetch.push_back(v);
      live += buffer;
    }
  }
  return a;
}

}  // namespace zero
