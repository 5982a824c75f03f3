#include "layout.hpp"

#include <algorithm>

#include "error.hpp"

namespace zero {
namespace {

size_t round_up(size_t n, size_t multiple) { return (n + multiple - 1) / multiple * multiple; }

}  // namespace

size_t ParamShape::numel() const {
  size_t n = 1;
  for (int64_t d : dims) n *= static_cast<size_t>(d);
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

Layout build_layout(const std::vector<ParamShape>& params, int world_size) {
  if (world_size < 1) fail(ZERO_ERR_INVALID_ARGUMENT, "world size must be at least 1");
  Layout layout;
  layout.world_size = world_size;
  int n_units = 0;
  for (const auto& p : params) n_units = std::max(n_units, p.unit + 1);
  layout.units.resize(n_units);
  layout.params.resize(params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    UnitLayout& u = layout.units[params[i].unit];
    size_t offset = round_up(u.used_elems, kParamAlignElems);
    layout.params[i] = ParamPlacement{params[i].unit, offset, params[i].numel()};
    u.used_elems = offset + params[i].numel();
    u.params.push_back(static_cast<int>(i));
  }
  size_t pad_multiple = kShardAlignElems * static_cast<size_t>(world_size);
  for (int u = 0; u < n_units; ++u) {
    UnitLayout& unit = layout.units[u];
    if (unit.params.empty())
      fail(ZERO_ERR_INVALID_ARGUMENT, "unit " + std::to_string(u) + " has no params; units must be numbered 0.." +
                                          std::to_string(n_units - 1) + " without gaps");
    unit.padded_elems = round_up(unit.used_elems, pad_multiple);
    unit.shard_elems = unit.padded_elems / world_size;
  }
  return layout;
}

std::vector<Bucket> build_buckets(const Layout& layout, int64_t bucket_elems) {
  std::vector<Bucket> buckets;
  for (int u = static_cast<int>(layout.units.size()) - 1; u >= 0; --u) {
    size_t n = layout.units[u].padded_elems;
    if (buckets.empty() || buckets.back().elems + n > static_cast<size_t>(bucket_elems)) buckets.emplace_back();
    Bucket& b = buckets.back();
    b.units.push_back(u);
    b.unit_offsets.push_back(b.elems);
    b.elems += n;
  }
  return buckets;
}

}  // namespace zero
