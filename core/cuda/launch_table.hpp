// How one fused step over many segments is cut into GPU thread blocks: a segment is a run of one param group's
// elements (KernelArgs with device pointers), a chunk is at most `chunk_elems` consecutive elements of one segment
// (one thread block's work), and a launch is a range of chunks whose segments take the same compiled loop (SGD's
// variant; every other optimizer has one). The table is computed on the host when the segments are laid out, so a
// step is one upload of the segments' per-step scalars and one launch per variant — usually exactly one.
//
// Every element's result depends only on its own streams, its segment's scalars (the norm is its own pass) and its
// global index, so the split changes no bits: tests/unit/launch_table_test.cpp steps a table's chunks one by one on the
// CPU with the shared element step and compares with one pass per segment.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "kernels/kernels.hpp"
#include "numeric/dtype.hpp"
#include "numeric/host_device.hpp"

namespace zero {
namespace cuda {

struct StepChunk {
  uint32_t segment = 0;  // index into the segments
  uint32_t count = 0;    // elements, 1 .. chunk_elems
  uint64_t begin = 0;    // first element, counted from the segment's start
};

struct StepLaunch {
  int sgd_variant = 0;     // kernels/step_element.hpp's kSgd* flags
  size_t first_chunk = 0;  // into LaunchTable::chunks
  size_t chunk_count = 0;
};

struct LaunchTable {
  std::vector<StepChunk> chunks;     // grouped by launch, each launch's chunks in segment order
  std::vector<StepLaunch> launches;  // in order of their variant's first segment
};

// The stochastic-rounding seed of a chunk's elements, as the CPU's parallel_step keys them (kernels/dispatch.cpp):
// the step's seed mixed with the high 32 bits of the element's global index. A chunk never crosses a multiple of
// 2^32 of the global index, so one seed serves the whole chunk.
ZERO_HD inline uint32_t chunk_seed(const KernelArgs& segment, const StepChunk& chunk) {
  return sr_index_seed(segment.s.seed, segment.first_index + chunk.begin);
}

// The default: 16 elements per thread for 256 threads.
constexpr size_t kDefaultChunkElems = 4096;

// Segments with n == 0 take no chunk; a chunk ends at every multiple of 2^32 of the global index (chunk_seed).
// chunk_elems must be in [1, 2^32); a segment count must fit in 32 bits.
LaunchTable plan_step_launches(OptimizerKind kind, const KernelArgs* segments, size_t count,
                               size_t chunk_elems = kDefaultChunkElems);

}  // namespace cuda
}  // namespace zero
