#include "memory/allocator.hpp"

#include <sys/mman.h>

#include <cstdint>
#include <cstdlib>
#include <new>

#include "util/error.hpp"

namespace zero {
namespace {

constexpr size_t kHugePage = size_t{2} << 20;

class HostAllocator final : public Allocator {
 public:
  void* allocate(size_t bytes, size_t alignment) override {
    void* p = std::aligned_alloc(alignment, bytes);
    if (p == nullptr) throw std::bad_alloc();
    if (alignment >= kHugePage) madvise(p, bytes, MADV_HUGEPAGE);  // a hint; fine if the kernel declines
    return p;
  }
  void deallocate(void* p, size_t /*bytes*/) noexcept override { std::free(p); }
  std::string name() const override { return "libzero's host allocator"; }
};

// Host memory that is not ours to free, shared by every engine: a static instance, never destroyed.
struct NoDelete {
  void operator()(Allocator*) const {}
};

}  // namespace

Allocator& host_allocator() {
  static HostAllocator instance;
  return instance;
}

void* CallbackAllocator::allocate(size_t bytes, size_t alignment) {
  void* p = alloc_(user_data_, bytes, alignment);
  if (p == nullptr) throw std::bad_alloc();
  if (reinterpret_cast<uintptr_t>(p) % alignment != 0) {
    free_(user_data_, p, bytes);
    fail(ZERO_ERR_INVALID_ARGUMENT,
         name() + " returned memory not aligned to the " + std::to_string(alignment) + " bytes asked for");
  }
  return p;
}

Allocators::Allocators() {
  by_space_[static_cast<int>(MemorySpace::kHost)] = std::shared_ptr<Allocator>(&host_allocator(), NoDelete{});
}

void Allocators::set(MemorySpace space, std::shared_ptr<Allocator> allocator) {
  by_space_[static_cast<int>(space)] = std::move(allocator);
}

const std::shared_ptr<Allocator>& Allocators::get(MemorySpace space, const char* what) const {
  const auto& a = by_space_[static_cast<int>(space)];
  if (!a)
    fail(ZERO_ERR_UNSUPPORTED, std::string("the placement plan puts ") + what + " in " + space_name(space) +
                                   " memory, which this build of libzero cannot allocate (no allocator for it; "
                                   "give one with zero_engine_set_allocator)");
  return a;
}

}  // namespace zero
