#include "params/norm_plan.hpp"

#include <algorithm>

#include "kernels/kernels.hpp"
#include "params/unit.hpp"

namespace zero {

NormPlan::NormPlan(const Plan& plan, const Layout& layout, const std::vector<Unit>& units, const NormSettings& settings,
                   bool state_on_nvme) {
  const size_t n_units = units.size();
  in_reduction_.assign(n_units, 0);
  // The update pass can sum the norm's squares only where it reads the same gradients in the same runs, and where
  // parallel_step's split at a multiple of 2^32 elements (stochastic rounding keys) falls on a block of the norm.
  // An offloaded pass walks the shard in chunks that cut segments anywhere: its squares would be summed in other
  // blocks, so the norm keeps a pass of its own over the (in-memory) gradients.
  bool update_covers_norm = !state_on_nvme;
  for (size_t u = 0; u < n_units; ++u) {
    const Unit& unit = units[u];
    const UnitPlan& up = plan.units[u];
    for (const auto* segments : {&unit.norm_segments, &unit.uncounted_segments})
      for (const ShardSegment& s : *segments)
        largest_segment_blocks_ = std::max(largest_segment_blocks_, sum_squares_blocks(s.numel));
    bool same = up.update_in_grads == up.norm_in_grads && unit.update_segments.size() == unit.norm_segments.size();
    for (size_t i = 0; same && i < unit.update_segments.size(); ++i) {
      const ShardSegment &s = unit.update_segments[i], &n = unit.norm_segments[i];
      same = s.shard_offset == n.shard_offset && s.numel == n.numel &&
             !splits_inside_a_norm_block(up.element_base + up.update_begin + s.shard_offset, s.numel);
    }
    update_covers_norm = update_covers_norm && same;
  }
  in_update_ = update_covers_norm && !settings.needed_first && !settings.on_device;
  if (settings.on_device) return;

  // Folding into the reduction pays where zero_step would otherwise read the norm's shard in a pass of its own:
  // where the norm is needed first, or where the optimizer pass cannot sum it (a rank that updates more than its
  // norm shard: stage 0 at N > 1). And only where a pass of the engine writes the reduced values: the bucket
  // accumulation (stages 2-3), or the widening from a narrower communication dtype (stages 0-1; otherwise the
  // backend writes them and nothing else touches them).
  if (!plan.bucketed() && !settings.widened) return;
  for (size_t u = 0; u < n_units; ++u) {
    const Unit& unit = units[u];
    const UnitPlan& up = plan.units[u];
    const size_t shard = layout.units[u].shard_elems, full = layout.units[u].padded_elems;
    bool ascending = true;
    size_t end = 0;
    for (const ShardSegment& s : unit.norm_segments) {
      ascending = ascending && s.shard_offset >= end;
      end = s.shard_offset + s.numel;
    }
    const bool pass_sums_norm =
        up.update_begin == up.norm_begin && up.update_in_grads == up.norm_in_grads && up.update_elems == shard;
    bool writes_norm_range;
    if (plan.bucketed()) {  // the accumulator is the shard the norm reads
      writes_norm_range = up.norm_in_grads == 0;
    } else {  // widened: everything (all-reduce) or the rank's block (reduce-scatter), into the place it is read
      const bool all = plan.reduction == GradReduction::kAllReduceInStep;
      const size_t begin = all ? 0 : up.update_begin, length = all ? full : shard;
      writes_norm_range =
          up.norm_in_grads == up.norm_begin && begin <= up.norm_begin && up.norm_begin + shard <= begin + length;
    }
    if (!(ascending && writes_norm_range && (settings.needed_first || !pass_sums_norm))) continue;
    in_reduction_[u] = 1;
    size_t blocks = 0;
    for (const ShardSegment& s : unit.norm_segments) blocks += sum_squares_blocks(s.numel);
    most_folded_blocks_ = std::max(most_folded_blocks_, blocks);
  }
}

}  // namespace zero
