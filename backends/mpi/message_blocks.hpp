// How a message of more elements than MPI's int count is sent: as count / block elements of a contiguous type of
// `block` elements. libzero pads huge unit shards so that such a block exists (core/plan/layout.hpp, kMaxMessageElems).
#pragma once

#include <cstdint>

namespace zero {

// The smallest power of two `block` (1 when count <= max_count) that divides `count` and brings count / block to
// at most `max_count`; 0 when there is none.
constexpr uint64_t message_block(uint64_t count, uint64_t max_count) {
  for (uint64_t block = 1; block != 0 && count % block == 0; block *= 2)
    if (count / block <= max_count) return block;
  return 0;
}

}  // namespace zero
