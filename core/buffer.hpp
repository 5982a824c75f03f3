// A 64-byte aligned, zero-initialised array of floats that owns its memory. Every byte the engine keeps lives in
// one of these, so the memory statistics are read off the buffers themselves and cannot drift from reality.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>

namespace zero {

class FloatBuffer {
 public:
  FloatBuffer() = default;
  explicit FloatBuffer(size_t n_elems) { resize(n_elems); }

  void resize(size_t n_elems) {
    data_.reset();
    n_elems_ = 0;
    if (n_elems == 0) return;
    // aligned_alloc wants a size that is a multiple of the alignment.
    size_t n_bytes = (n_elems * sizeof(float) + kAlign - 1) / kAlign * kAlign;
    void* p = std::aligned_alloc(kAlign, n_bytes);
    if (p == nullptr) throw std::bad_alloc();
    std::memset(p, 0, n_bytes);
    data_.reset(static_cast<float*>(p));
    n_elems_ = n_elems;
  }
  void release() { resize(0); }
  void zero() {
    if (n_elems_ != 0) std::memset(data_.get(), 0, n_elems_ * sizeof(float));
  }

  float* data() { return data_.get(); }
  const float* data() const { return data_.get(); }
  size_t size() const { return n_elems_; }
  uint64_t n_bytes() const { return static_cast<uint64_t>(n_elems_) * sizeof(float); }
  bool empty() const { return n_elems_ == 0; }

 private:
  static constexpr size_t kAlign = 64;
  struct Free {
    void operator()(float* p) const { std::free(p); }
  };
  std::unique_ptr<float, Free> data_;
  size_t n_elems_ = 0;
};

}  // namespace zero
