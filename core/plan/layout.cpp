#include "plan/layout.hpp"

#include <algorithm>
#include <cstdint>

#include "util/error.hpp"

namespace zero {
namespace {

size_t round_up(size_t n, size_t multiple) { return (n + multiple - 1) / multiple * multiple; }

}  // namespace

size_t ParamShape::numel() const {
  size_t n = 1;
  for (int64_t d : dims) {
    if (d < 0 || (d != 0 && n > SIZE_MAX / static_cast<size_t>(d))) return SIZE_MAX;
    n *= static_cast<size_t>(d);
  }
  return n;
}

size_t Layout::total_padded_elems() const {
  size_t total = 0;
  for (const auto& u : units) total += u.padded_elems;
  return total;
}

std::vector<ShardSegment> Layout::segments(int unit, size_t begin, size_t length,
                                           const std::vector<ParamShape>& shapes) const {
  std::vector<ShardSegment> out;
  size_t end = begin + length;
  for (int p : units[unit].params) {
    const ParamPlacement& pl = params[p];
    size_t lo = std::max(begin, pl.offset), hi = std::min(end, pl.offset + pl.numel);
    if (lo >= hi) continue;
    out.push_back(ShardSegment{lo - begin, hi - lo, p, shapes[p].group});
  }
  return out;
}

namespace {

// The shard of `used` items over `world` ranks: `align`-aligned, and above kMaxMessageElems items per message a
// multiple of the smallest power-of-two block that brings shard / block under it.
size_t shard_for(size_t used, int world, size_t align) {
  const size_t n = static_cast<size_t>(world);
  size_t shard = round_up((used + n - 1) / n, align);
  size_t block = align;
  while (round_up(shard, block) / block > kMaxMessageElems) block *= 2;
  return round_up(shard, block);
}

}  // namespace

size_t shard_elems_for(size_t used, int world) { return shard_for(used, world, kShardAlignElems); }

size_t frozen_shard_bytes_for(size_t used, int world) { return shard_for(used, world, kFrozenAlignBytes); }

Layout build_layout(const std::vector<ParamShape>& params, int world_size) {
  if (world_size < 1) fail(ZERO_ERR_INVALID_ARGUMENT, "world size must be at least 1");
  Layout layout;
  layout.world_size = world_size;
  // Units are numbered 0..U-1 without gaps and none is empty, so no unit id reaches the number of params: a larger
  // one is an error before anything is sized by it (a stray huge id must not become an allocation).
  int n_units = 0;
  for (const auto& p : params) {
    if (p.unit < 0) fail(ZERO_ERR_INVALID_ARGUMENT, "param '" + p.name + "': unit must be >= 0");
    if (static_cast<size_t>(p.unit) >= params.size()) {
      std::vector<bool> used(params.size(), false);
      for (const auto& q : params)
        if (q.unit >= 0 && static_cast<size_t>(q.unit) < params.size()) used[static_cast<size_t>(q.unit)] = true;
      const size_t gap = static_cast<size_t>(std::find(used.begin(), used.end(), false) - used.begin());
      fail(ZERO_ERR_INVALID_ARGUMENT, "unit " + std::to_string(gap) + " has no params (param '" + p.name +
                                          "' is in unit " + std::to_string(p.unit) +
                                          "); units must be numbered 0..U-1 without gaps");
    }
    n_units = std::max(n_units, p.unit + 1);
  }
  layout.units.resize(n_units);
  layout.params.resize(params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    UnitLayout& u = layout.units[params[i].unit];
    const size_t numel = params[i].numel();
    if (params[i].frozen) {
      const size_t offset = round_up(u.frozen_used_bytes, kFrozenAlignBytes), size = stored_size(params[i].stored);
      if (numel > kMaxModelElems || offset > kMaxModelElems - numel * size)
        fail(ZERO_ERR_INVALID_ARGUMENT, "unit " + std::to_string(params[i].unit) +
                                            " has more than 2^56 bytes of frozen params with param '" + params[i].name +
                                            "'");
      layout.params[i] = ParamPlacement{params[i].unit, true, offset, numel, numel * size};
      u.frozen_used_bytes = offset + numel * size;
      u.frozen_elems += numel;
      u.frozen_params.push_back(static_cast<int>(i));
      continue;
    }
    const size_t offset = round_up(u.used_elems, kParamAlignElems);
    if (numel > kMaxModelElems || offset > kMaxModelElems - numel)
      fail(ZERO_ERR_INVALID_ARGUMENT, "unit " + std::to_string(params[i].unit) +
                                          " has more than 2^56 elements with param '" + params[i].name + "'");
    layout.params[i] = ParamPlacement{params[i].unit, false, offset, numel, 0};
    u.used_elems = offset + numel;
    u.params.push_back(static_cast<int>(i));
  }
  uint64_t total = 0, total_frozen = 0;
  for (int u = 0; u < n_units; ++u) {
    UnitLayout& unit = layout.units[u];
    if (unit.params.empty() && unit.frozen_params.empty())
      fail(ZERO_ERR_INVALID_ARGUMENT, "unit " + std::to_string(u) + " has no params; units must be numbered 0.." +
                                          std::to_string(n_units - 1) + " without gaps");
    // A unit of frozen params only has no elements to train: no shard, no gradient, no optimizer state.
    unit.shard_elems = unit.params.empty() ? 0 : shard_elems_for(unit.used_elems, world_size);
    unit.padded_elems = unit.shard_elems * static_cast<size_t>(world_size);
    unit.frozen_shard_bytes =
        unit.frozen_params.empty() ? 0 : frozen_shard_bytes_for(unit.frozen_used_bytes, world_size);
    unit.frozen_padded_bytes = unit.frozen_shard_bytes * static_cast<size_t>(world_size);
    total += unit.padded_elems;
    total_frozen += unit.frozen_padded_bytes;
    if (total > kMaxModelElems)
      fail(ZERO_ERR_INVALID_ARGUMENT,
           "the model has more than 2^56 elements (with padding) by unit " + std::to_string(u));
    if (total_frozen > kMaxModelElems)
      fail(ZERO_ERR_INVALID_ARGUMENT,
           "the model has more than 2^56 bytes of frozen params (with padding) by unit " + std::to_string(u));
  }
  return layout;
}

std::vector<BucketLayout> build_buckets(const Layout& layout, int64_t bucket_elems) {
  std::vector<BucketLayout> buckets;
  for (int u = static_cast<int>(layout.units.size()) - 1; u >= 0; --u) {
    size_t n = layout.units[u].padded_elems;
    if (n == 0) continue;  // frozen params only: no gradients
    if (buckets.empty() || buckets.back().elems + n > static_cast<size_t>(bucket_elems)) buckets.emplace_back();
    BucketLayout& b = buckets.back();
    b.units.push_back(u);
    b.unit_offsets.push_back(b.elems);
    b.elems += n;
  }
  return buckets;
}

}  // namespace zero
