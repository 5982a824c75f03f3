// The emulator's device memory: one reserved range of addresses the host cannot touch (mapped PROT_NONE, so a host
// read or write of a device pointer faults at once), backed by a second mapping of the same size that only the
// emulator's streams use ("the shadow": device address + a fixed offset). Allocations are first-fit in the range,
// kDeviceAlignment-aligned; a released block keeps the clock of its release, which the next user of those bytes
// merges (the ordering CUDA's stream-ordered pools insert themselves).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>

#include "device/access_checker.hpp"

namespace zero {
namespace device {

class EmulatedMemory {
 public:
  explicit EmulatedMemory(size_t arena_bytes);
  ~EmulatedMemory();
  EmulatedMemory(const EmulatedMemory&) = delete;
  EmulatedMemory& operator=(const EmulatedMemory&) = delete;

  struct Block {
    void* device = nullptr;
    VectorClock released;  // merged clocks of the releases of the bytes it reuses
  };
  // Throws std::bad_alloc when no free block is large enough.
  Block allocate(size_t bytes);
  // `at`: the clock of the release's operation.
  void release(void* device, const VectorClock& at);

  bool in_arena(const void* p) const;
  // Throws ZERO_ERR_INTERNAL unless [p, p + bytes) lies in one live allocation (`what` names the access).
  void require_live(const void* p, size_t bytes, const char* what) const;
  // The size asked for by the live allocation that starts at `p`, or 0.
  size_t allocation_bytes(const void* p) const;
  // The host-usable address of a device address (for the emulator's streams only).
  void* shadow(const void* device) const {
    return shadow_ + (reinterpret_cast<uintptr_t>(device) - reinterpret_cast<uintptr_t>(guard_));
  }
  size_t live_bytes() const;

 private:
  struct FreeBlock {
    size_t bytes;
    VectorClock released;
  };
  size_t arena_bytes_;
  unsigned char* guard_ = nullptr;   // the addresses handed out: PROT_NONE
  unsigned char* shadow_ = nullptr;  // the bytes behind them
  mutable std::mutex mu_;
  std::map<uintptr_t, FreeBlock> free_;  // by address, adjacent blocks coalesced
  struct Live {
    size_t asked;     // what the caller may use: bounds are checked against it
    size_t reserved;  // rounded up to the alignment
  };
  std::map<uintptr_t, Live> live_;  // by address
};

}  // namespace device
}  // namespace zero
