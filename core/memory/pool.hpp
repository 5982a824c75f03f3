// Buffers of one capacity handed out and taken back, so that nothing is allocated per step: gathered units at
// stage 3, gradient buckets at stages 2-3. reserve() allocates before any collective needs a buffer, so a
// collective never allocates (a rank that could not would leave the others waiting).
#pragma once

#include <algorithm>
#include <cstddef>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "memory/buffer.hpp"
#include "util/error.hpp"

namespace zero {

class BufferPool {
 public:
  void set_capacity(MemorySpace space, size_t elems, DType dtype, std::shared_ptr<Allocator> allocator) {
    space_ = space, capacity_ = elems, dtype_ = dtype, allocator_ = std::move(allocator);
  }
  void reserve(size_t buffers) {
    while (free_.size() < buffers) {
      auto b = std::make_unique<Buffer>();
      b->allocate(space_, capacity_, dtype_, allocator_);  // joins the pool only once it exists
      free_.reserve(all_.size() + 1);
      all_.push_back(std::move(b));
      free_.push_back(all_.back()->data());
    }
  }
  bool has_free() const { return !free_.empty(); }
  // reserve() first.
  void* acquire() {
    if (free_.empty()) fail(ZERO_ERR_INTERNAL, "a pooled buffer was taken without being reserved first");
    void* buffer = free_.back();
    run_fence(buffer);  // may throw: the buffer stays free, its fence kept
    free_.pop_back();
    return buffer;
  }
  // `before_reuse` runs when the buffer is next taken, before its taker's work: a copy still reading it (ZeRO-Offload's
  // gradients on their way to the host) orders that work after itself then, not at once.
  void give_back(void* buffer, std::function<void()> before_reuse = nullptr) {
    if (before_reuse) fences_.emplace_back(buffer, std::move(before_reuse));
    free_.push_back(buffer);
  }
  size_t buffers() const { return all_.size(); }
  uint64_t allocated_bytes() const {
    uint64_t total = 0;
    for (const auto& b : all_) total += b->n_bytes();
    return total;
  }
  // Frees buffers beyond `keep`, when all of them are back in the pool (never one in use).
  void trim(size_t keep) {
    if (free_.size() != all_.size()) return;
    while (all_.size() > keep) {
      void* buffer = all_.back()->data();
      run_fence(buffer);  // its release is ordered after the copy too (may throw: nothing changed)
      free_.erase(std::find(free_.begin(), free_.end(), buffer));
      all_.pop_back();
    }
  }
  // After a timeout a backend may still write into the buffers: they are never freed.
  void leak() {
    for (auto& b : all_) b->leak();
  }
  // One buffer a collective still in flight may write (the engine goes; the backend may not have finished).
  void leak_one(void* buffer) {
    for (auto& b : all_)
      if (b->data() == buffer) b->leak();
  }
  void clear() {
    free_.clear();
    fences_.clear();
    all_.clear();
  }
  MemorySpace space() const { return space_; }

 private:
  void run_fence(void* buffer) {
    for (size_t i = 0; i < fences_.size(); ++i) {
      if (fences_[i].first != buffer) continue;
      fences_[i].second();
      fences_.erase(fences_.begin() + static_cast<std::ptrdiff_t>(i));
      return;
    }
  }

  MemorySpace space_ = MemorySpace::kHost;
  size_t capacity_ = 0;
  DType dtype_ = DType::kF32;
  std::shared_ptr<Allocator> allocator_;
  std::vector<std::unique_ptr<Buffer>> all_;
  std::vector<void*> free_;
  std::vector<std::pair<void*, std::function<void()>>> fences_;  // of free buffers, run when they are taken
};

}  // namespace zero
