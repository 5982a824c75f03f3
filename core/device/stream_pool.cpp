#include "device/stream_pool.hpp"

#include <algorithm>

#include "util/error.hpp"

namespace zero {
namespace device {

StreamBufferPool::~StreamBufferPool() {
  // An engine torn down after an error may not have given every buffer back: those are left to the runtime's
  // teardown rather than released under work that may still use them.
  if (free_.size() != all_.size() || all_.empty()) return;
  try {
    std::unique_ptr<Stream> stream = runtime_.create_stream("buffer pool teardown");
    clear(*stream);
  } catch (...) {
  }
}

void StreamBufferPool::reserve(size_t count, Stream& stream) {
  while (all_.size() < count) {
    Slot slot{runtime_.allocate(bytes_, stream), runtime_.create_event()};
    runtime_.record(*slot.last_use, stream);  // the allocation is its first "use"
    free_.reserve(all_.size() + 1);
    all_.push_back(std::move(slot));
    free_.push_back(all_.size() - 1);
  }
}

void* StreamBufferPool::acquire(Stream& user) {
  if (free_.empty()) fail(ZERO_ERR_INTERNAL, "a pooled device buffer was taken without being reserved first");
  Slot& slot = all_[free_.back()];
  free_.pop_back();
  runtime_.wait(user, *slot.last_use);
  return slot.data;
}

StreamBufferPool::Slot& StreamBufferPool::slot_of(void* buffer) {
  for (Slot& slot : all_)
    if (slot.data == buffer) return slot;
  fail(ZERO_ERR_INTERNAL, "a buffer given back to a device pool that did not hand it out");
}

void StreamBufferPool::give_back(void* buffer, Stream& last_user) {
  Slot& slot = slot_of(buffer);
  const size_t index = static_cast<size_t>(&slot - all_.data());
  if (std::find(free_.begin(), free_.end(), index) != free_.end())
    fail(ZERO_ERR_INTERNAL, "a device buffer given back twice");
  runtime_.record(*slot.last_use, last_user);
  free_.push_back(index);
}

void StreamBufferPool::clear(Stream& stream) {
  if (free_.size() != all_.size()) fail(ZERO_ERR_INTERNAL, "a device buffer pool cleared while a buffer is in use");
  for (Slot& slot : all_) {
    runtime_.wait(stream, *slot.last_use);
    runtime_.release(slot.data, stream);
  }
  all_.clear();
  free_.clear();
}

}  // namespace device
}  // namespace zero
