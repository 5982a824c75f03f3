// Memory a backend may still use after the engine gave up on it (a buffer a collective left in flight, a sink it
// may still call): never freed, and reachable from here for the life of the process, so that a leak checker sees
// it kept, not lost.
#pragma once

#include <memory>
#include <mutex>
#include <vector>

namespace zero {

inline void keep_forever_pointer(const void* kept) {
  static std::mutex mutex;
  static std::vector<const void*>* const all = new std::vector<const void*>();
  std::lock_guard<std::mutex> lock(mutex);
  all->push_back(kept);
}

template <class T, class Deleter>
void keep_forever(std::unique_ptr<T, Deleter> owned) {
  keep_forever_pointer(owned.release());
}

}  // namespace zero
