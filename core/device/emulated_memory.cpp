#include "device/emulated_memory.hpp"

#include <sys/mman.h>

#include <new>
#include <string>

#include "device/runtime.hpp"
#include "util/error.hpp"

namespace zero {
namespace device {
namespace {

// Address space only: MAP_NORESERVE, so an arena of many GiB costs what is touched.
unsigned char* reserve(size_t bytes, int protection) {
  void* p = mmap(nullptr, bytes, protection, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED)
    fail(ZERO_ERR_OUT_OF_MEMORY, "device emulator: could not reserve " + std::to_string(bytes) + " bytes of addresses");
  return static_cast<unsigned char*>(p);
}

size_t round_up(size_t bytes) { return (bytes + kDeviceAlignment - 1) / kDeviceAlignment * kDeviceAlignment; }

}  // namespace

EmulatedMemory::EmulatedMemory(size_t arena_bytes) : arena_bytes_(round_up(arena_bytes)) {
  guard_ = reserve(arena_bytes_, PROT_NONE);
  try {
    shadow_ = reserve(arena_bytes_, PROT_READ | PROT_WRITE);
  } catch (...) {
    munmap(guard_, arena_bytes_);
    throw;
  }
  free_[reinterpret_cast<uintptr_t>(guard_)] = FreeBlock{arena_bytes_, {}};
}

EmulatedMemory::~EmulatedMemory() {
  munmap(shadow_, arena_bytes_);
  munmap(guard_, arena_bytes_);
}

EmulatedMemory::Block EmulatedMemory::allocate(size_t bytes) {
  const size_t want = round_up(bytes == 0 ? 1 : bytes);
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if (it->second.bytes < want) continue;
    Block block;
    block.device = reinterpret_cast<void*>(it->first);
    block.released = it->second.released;
    if (it->second.bytes > want) free_[it->first + want] = FreeBlock{it->second.bytes - want, it->second.released};
    free_.erase(it);
    live_[reinterpret_cast<uintptr_t>(block.device)] = Live{bytes, want};
    return block;
  }
  throw std::bad_alloc();
}

void EmulatedMemory::release(void* device, const VectorClock& at) {
  std::lock_guard<std::mutex> lock(mu_);
  auto live = live_.find(reinterpret_cast<uintptr_t>(device));
  if (live == live_.end())
    fail(ZERO_ERR_INTERNAL, "device emulator: release of a pointer that is not a live device allocation");
  uintptr_t begin = live->first;
  FreeBlock block{live->second.reserved, at};
  live_.erase(live);
  // Coalesce with the neighbours: the merged block's clock orders its next user after both releases.
  auto next = free_.find(begin + block.bytes);
  if (next != free_.end()) {
    block.bytes += next->second.bytes;
    block.released.merge(next->second.released);
    free_.erase(next);
  }
  auto prev = free_.lower_bound(begin);
  if (prev != free_.begin()) {
    --prev;
    if (prev->first + prev->second.bytes == begin) {
      begin = prev->first;
      block.bytes += prev->second.bytes;
      block.released.merge(prev->second.released);
      free_.erase(prev);
    }
  }
  free_[begin] = std::move(block);
}

bool EmulatedMemory::in_arena(const void* p) const {
  const auto a = reinterpret_cast<uintptr_t>(p), g = reinterpret_cast<uintptr_t>(guard_);
  return a >= g && a < g + arena_bytes_;
}

void EmulatedMemory::require_live(const void* p, size_t bytes, const char* what) const {
  std::lock_guard<std::mutex> lock(mu_);
  const auto a = reinterpret_cast<uintptr_t>(p);
  auto it = live_.upper_bound(a);
  if (it != live_.begin()) {
    --it;
    const size_t asked = it->second.asked;
    if (a >= it->first && a + bytes <= it->first + asked) return;
    if (a < it->first + it->second.reserved)
      fail(ZERO_ERR_INTERNAL,
           std::string("device emulator: ") + what + " reaches " + std::to_string(a + bytes - it->first - asked) +
               " bytes past the end of its device allocation of " + std::to_string(asked) + " bytes");
  }
  fail(ZERO_ERR_INTERNAL, std::string("device emulator: ") + what +
                              " touches device memory that is not allocated (released, or never allocated)");
}

size_t EmulatedMemory::allocation_bytes(const void* p) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = live_.find(reinterpret_cast<uintptr_t>(p));
  return it == live_.end() ? 0 : it->second.asked;
}

size_t EmulatedMemory::live_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  size_t total = 0;
  for (const auto& [base, live] : live_) total += live.reserved;
  return total;
}

}  // namespace device
}  // namespace zero
