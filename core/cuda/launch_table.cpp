#include "cuda/launch_table.hpp"

#include <algorithm>
#include <string>

#include "kernels/step_element.hpp"
#include "util/error.hpp"

namespace zero {
namespace cuda {

LaunchTable plan_step_launches(OptimizerKind kind, const KernelArgs* segments, size_t count, size_t chunk_elems) {
  if (chunk_elems == 0 || chunk_elems > UINT32_MAX)
    fail(ZERO_ERR_INVALID_ARGUMENT,
         "a GPU step chunk must hold 1 to 2^32 - 1 elements, not " + std::to_string(chunk_elems));
  if (count > UINT32_MAX)
    fail(ZERO_ERR_INVALID_ARGUMENT, "a fused GPU step takes at most 2^32 - 1 segments, not " + std::to_string(count));
  LaunchTable table;
  // Variants in order of first appearance; each collects its segments' chunks in segment order.
  std::vector<int> variants;
  std::vector<std::vector<StepChunk>> chunks;
  for (size_t s = 0; s < count; ++s) {
    const KernelArgs& a = segments[s];
    if (a.n == 0) continue;
    const int variant = kernel_detail::sgd_variant(kind, a);
    auto it = std::find(variants.begin(), variants.end(), variant);
    if (it == variants.end()) {
      variants.push_back(variant);
      chunks.emplace_back();
      it = variants.end() - 1;
    }
    std::vector<StepChunk>& out = chunks[static_cast<size_t>(it - variants.begin())];
    for (size_t begin = 0; begin < a.n;) {
      const uint64_t to_boundary = (uint64_t{1} << 32) - ((a.first_index + begin) & 0xffffffffu);
      const size_t count = static_cast<size_t>(std::min<uint64_t>({chunk_elems, a.n - begin, to_boundary}));
      out.push_back({static_cast<uint32_t>(s), static_cast<uint32_t>(count), begin});
      begin += count;
    }
  }
  for (size_t v = 0; v < variants.size(); ++v) {
    table.launches.push_back({variants[v], table.chunks.size(), chunks[v].size()});
    table.chunks.insert(table.chunks.end(), chunks[v].begin(), chunks[v].end());
  }
  return table;
}

}  // namespace cuda
}  // namespace zero
