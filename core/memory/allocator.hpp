// Allocators, one per memory space and engine. The host allocator is libzero's own (64-byte aligned, 2 MiB aligned
// and advised to use transparent huge pages from 2 MiB up); a framework may hand the engine its own allocator for
// any space through the experimental zero_engine_set_allocator (ONNX Runtime's OrtAllocator in spirit), so that
// the engine's memory comes from the framework's pool and shows in its accounting.
#pragma once

#include <array>
#include <cstddef>
#include <memory>
#include <string>

#include "memory/space.hpp"

namespace zero {

class Allocator {
 public:
  virtual ~Allocator() = default;
  // `bytes` is a multiple of `alignment` (a power of two). Returns memory aligned to it; throws std::bad_alloc or
  // zero::Error on failure.
  virtual void* allocate(size_t bytes, size_t alignment) = 0;
  virtual void deallocate(void* p, size_t bytes) noexcept = 0;
  virtual std::string name() const = 0;
};

// libzero's host allocator (aligned_alloc; madvise(MADV_HUGEPAGE) from 2 MiB up).
Allocator& host_allocator();

// An allocator given through the C API: two callbacks and the caller's pointer.
class CallbackAllocator final : public Allocator {
 public:
  using AllocFn = void* (*)(void* user_data, size_t bytes, size_t alignment);
  using FreeFn = void (*)(void* user_data, void* p, size_t bytes);
  CallbackAllocator(MemorySpace space, AllocFn alloc, FreeFn free, void* user_data)
      : space_(space), alloc_(alloc), free_(free), user_data_(user_data) {}
  void* allocate(size_t bytes, size_t alignment) override;
  void deallocate(void* p, size_t bytes) noexcept override { free_(user_data_, p, bytes); }
  std::string name() const override { return std::string("the caller's ") + space_name(space_) + " allocator"; }

 private:
  MemorySpace space_;
  AllocFn alloc_;
  FreeFn free_;
  void* user_data_;
};

// Which allocator serves each space for one engine. Buffers keep a shared reference to theirs, so an allocator
// outlives every buffer it gave out.
class Allocators {
 public:
  Allocators();
  void set(MemorySpace space, std::shared_ptr<Allocator> allocator);
  // Throws ZERO_ERR_UNSUPPORTED naming the space when it has no allocator in this build.
  const std::shared_ptr<Allocator>& get(MemorySpace space, const char* what) const;
  bool has(MemorySpace space) const { return by_space_[static_cast<int>(space)] != nullptr; }

 private:
  std::array<std::shared_ptr<Allocator>, kNumMemorySpaces> by_space_;
};

}  // namespace zero
