// A 64-byte aligned, zero-initialised array of elements of one dtype that owns its memory. Every byte the engine
// keeps lives in one of these, so the memory statistics are read off the buffers themselves and cannot drift
// from reality. Buffers of 2 MiB or more are 2 MiB-aligned and advised to use transparent huge pages.
#pragma once

#include <sys/mman.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>

#include "dtype.hpp"

namespace zero {

class Buffer {
 public:
  Buffer() = default;
  Buffer(size_t n_elems, DType dtype) { resize(n_elems, dtype); }

  void resize(size_t n_elems, DType dtype) {
    data_.reset();
    n_elems_ = 0;
    dtype_ = dtype;
    if (n_elems == 0) return;
    const size_t bytes = n_elems * dtype_size(dtype);
    const size_t align = bytes >= kHugePage ? kHugePage : 64;
    const size_t n_bytes = (bytes + align - 1) / align * align;  // aligned_alloc wants a multiple of the alignment
    void* p = std::aligned_alloc(align, n_bytes);
    if (p == nullptr) throw std::bad_alloc();
    if (align == kHugePage) madvise(p, n_bytes, MADV_HUGEPAGE);  // a hint; fine if the kernel declines
    std::memset(p, 0, n_bytes);
    data_.reset(static_cast<unsigned char*>(p));
    n_elems_ = n_elems;
  }
  void release() { resize(0, dtype_); }
  // Gives up the memory without freeing it: a communication backend may still write into it (after a timeout).
  void leak() {
    static_cast<void>(data_.release());
    n_elems_ = 0;
  }
  void zero() {
    if (n_elems_ != 0) std::memset(data_.get(), 0, n_bytes());
  }

  void* data() { return data_.get(); }
  const void* data() const { return data_.get(); }
  float* f32() { return reinterpret_cast<float*>(data_.get()); }
  // The element at `index` (a byte offset computed from the dtype).
  void* at(size_t index) { return data_.get() + index * dtype_size(dtype_); }
  size_t size() const { return n_elems_; }
  DType dtype() const { return dtype_; }
  uint64_t n_bytes() const { return static_cast<uint64_t>(n_elems_) * dtype_size(dtype_); }
  bool empty() const { return n_elems_ == 0; }

 private:
  static constexpr size_t kHugePage = size_t{2} << 20;
  struct Free {
    void operator()(unsigned char* p) const { std::free(p); }
  };
  std::unique_ptr<unsigned char, Free> data_;
  size_t n_elems_ = 0;
  DType dtype_ = DType::kF32;
};

}  // namespace zero
