// Fetching ahead at stage 3 (DeepSpeed's stage3_ keys; docs/architecture.md, "Fetching ahead"): which units to
// all-gather before zero_gather asks for them, and which to keep after zero_release. A pure function of what every
// rank shares — the agreed gathers, the order they recorded, the policy — never of a rank's own zero_release
// timing, so that every rank starts the same collectives.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

namespace zero {

struct FetchPolicy {
  bool background_publish = false;  // overlap_comm: the all-gathers after the step complete when a unit is gathered
  int64_t prefetch_elements = 0;    // how far ahead of the recorded order to all-gather (stage3_prefetch_bucket_size)
  int64_t max_live_elements = 0;    // what the store may hold on its own, prefetched or kept (max_live_parameters)
  int64_t max_reuse_distance = 0;   // keep a released unit needed again within this many elements
};

// The order the sharded units were gathered in the previous micro-step, and where this micro-step is in it.
struct FetchOrder {
  std::vector<int> order;
  size_t cursor = 0;  // the position after the last gather that followed the order
  bool lost = false;  // this micro-step left the order: nothing is fetched ahead until it ends
};

// What the decision at one zero_gather needs to know of the units.
struct FetchState {
  const std::vector<uint64_t>* unit_elems = nullptr;  // padded elements per unit
  uint64_t buffer_elems = 0;                          // one pooled buffer: the largest sharded unit
  uint64_t live_elements = 0;                         // pooled buffers the store holds by its own choice, in elements
  std::function<bool(int unit)> holds_ahead;          // fetched or fetching ahead, kept, or its next use fetched
  // The next micro-step belongs to the same accumulation window (the params do not change in between): what lies
  // ahead reaches into its first units, up to one whole cycle of the order.
  bool next_in_window = false;
};

// The decision at zero_gather(unit) of a unit with sharded params.
struct AheadPlan {
  size_t cursor = 0;          // the order's new position
  bool lost = false;          // the model took a path the order does not have
  bool keep = false;          // zero_release keeps the unit's buffer for its next use
  std::vector<int> prefetch;  // units to all-gather now, in order
};

// The gathered unit is the order's next one, or one a little further on (units skipped this time); one the order
// does not have ahead loses the order. Reuse: keep the unit when the order gathers it again with fewer than
// max_reuse_distance elements in between (0 keeps nothing; 1 keeps a unit gathered again next, as backward does
// with forward's last). Prefetch: the units the order gathers next, up to prefetch_elements ahead (what is already
// ahead counts), within max_live_elements counted in pooled buffers, so that the budget bounds memory.
AheadPlan plan_ahead(const FetchPolicy& policy, const FetchOrder& order, int unit, const FetchState& state);

}  // namespace zero
