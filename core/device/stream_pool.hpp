// Device buffers of one size handed from stream to stream without the host waiting: a buffer comes back with the
// event of its last use recorded on the stream that used it last, and the next taker's stream waits for that event
// before any of its work touches the buffer (FSDP2's rule: every buffer carries the event of its last use). So a
// gathered unit or a gradient bucket is reused as soon as the device is done with it, never earlier, and never
// after a device-wide synchronization.
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include "device/runtime.hpp"

namespace zero {
namespace device {

class StreamBufferPool {
 public:
  StreamBufferPool(Runtime& runtime, size_t bytes) : runtime_(runtime), bytes_(bytes) {}
  ~StreamBufferPool();
  StreamBufferPool(const StreamBufferPool&) = delete;
  StreamBufferPool& operator=(const StreamBufferPool&) = delete;

  // Allocates until `count` buffers exist, ordered on `stream` (before any collective needs one).
  void reserve(size_t count, Stream& stream);
  size_t buffers() const { return all_.size(); }
  bool has_free() const { return !free_.empty(); }
  // A free buffer for work on `user`: the stream waits for the buffer's last use. reserve() first.
  void* acquire(Stream& user);
  // The last use of `buffer` was queued on `last_user`.
  void give_back(void* buffer, Stream& last_user);
  // Releases every buffer, each ordered after its last use; all must have been given back.
  void clear(Stream& stream);

 private:
  struct Slot {
    void* data;
    std::unique_ptr<Event> last_use;
  };
  Slot& slot_of(void* buffer);

  Runtime& runtime_;
  const size_t bytes_;
  std::vector<Slot> all_;
  std::vector<size_t> free_;  // indices into all_
};

}  // namespace device
}  // namespace zero
