// A buffer: `elements` of one dtype in one memory space, owned, 64-byte aligned (2 MiB from 2 MiB up) and zeroed
// when allocated. Every byte the engine keeps lives in one of these, so the memory statistics can be checked
// against the placement plan that decided them (core/plan/plan.hpp). The allocator comes from the engine's table
// (memory/allocator.hpp) and is kept alive by the buffer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>

#include "memory/allocator.hpp"
#include "memory/ops.hpp"
#include "numeric/dtype.hpp"

namespace zero {

class Buffer {
 public:
  Buffer() = default;
  ~Buffer() { release(); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  Buffer(Buffer&& other) noexcept { *this = std::move(other); }
  Buffer& operator=(Buffer&& other) noexcept {
    if (this != &other) {
      release();
      data_ = other.data_, n_elems_ = other.n_elems_, allocated_bytes_ = other.allocated_bytes_;
      dtype_ = other.dtype_, space_ = other.space_, allocator_ = std::move(other.allocator_);
      other.data_ = nullptr, other.n_elems_ = 0, other.allocated_bytes_ = 0;
    }
    return *this;
  }

  // Replaces the contents with `n_elems` zeroed elements from `allocator`, which serves `space`.
  void allocate(MemorySpace space, size_t n_elems, DType dtype, std::shared_ptr<Allocator> allocator) {
    release();
    space_ = space;
    dtype_ = dtype;
    if (n_elems == 0) return;
    const size_t bytes = n_elems * dtype_size(dtype);
    const size_t align = bytes >= kHugePage ? kHugePage : 64;
    const size_t n_bytes = (bytes + align - 1) / align * align;  // aligned_alloc wants a multiple of the alignment
    void* p = allocator->allocate(n_bytes, align);
    data_ = static_cast<unsigned char*>(p);
    allocated_bytes_ = n_bytes;
    allocator_ = std::move(allocator);
    n_elems_ = n_elems;
    fill_zero(space_, data_, n_bytes);
  }
  void release() {
    if (data_ != nullptr) allocator_->deallocate(data_, allocated_bytes_);
    data_ = nullptr;
    n_elems_ = 0;
    allocated_bytes_ = 0;
    allocator_.reset();
  }
  // Gives up the memory without freeing it: a communication backend may still write into it (after a timeout).
  void leak() {
    data_ = nullptr;
    release();
  }
  void zero() { fill_zero(space_, data_, n_bytes()); }

  void* data() { return data_; }
  const void* data() const { return data_; }
  float* f32() { return reinterpret_cast<float*>(data_); }
  // The element at `index` (a byte offset computed from the dtype).
  void* at(size_t index) { return data_ + index * dtype_size(dtype_); }
  size_t size() const { return n_elems_; }
  DType dtype() const { return dtype_; }
  MemorySpace space() const { return space_; }
  uint64_t n_bytes() const { return static_cast<uint64_t>(n_elems_) * dtype_size(dtype_); }
  bool empty() const { return n_elems_ == 0; }

 private:
  static constexpr size_t kHugePage = size_t{2} << 20;
  unsigned char* data_ = nullptr;
  size_t n_elems_ = 0;
  size_t allocated_bytes_ = 0;
  DType dtype_ = DType::kF32;
  MemorySpace space_ = MemorySpace::kHost;
  std::shared_ptr<Allocator> allocator_;
};

}  // namespace zero
