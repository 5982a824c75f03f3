// The device GPT's backend on the CPU: each() runs a launch's items one after another (in reverse order on request,
// which a test uses to show that no item reads another's output), memory is host memory, and the matmuls are a
// function the caller chooses: a plain loop in the trainer (no BLAS library to ship), OpenBLAS in the tests, which
// then give model.hpp's bits exactly.
#pragma once

#include <cstddef>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "layers.hpp"

namespace gpt {
namespace device {

// Row-major C = op(A) . op(B) + beta C, as CBLAS's gemm with alpha 1 (beta 0 ignores C's old values).
template <class T>
using GemmFunction = void (*)(bool trans_a, bool trans_b, int m, int n, int k, const T* a, int lda, const T* b, int ldb,
                              T beta, T* c, int ldc);

// The plain loop: each output element's dot product in k order.
template <class T>
void loop_gemm(bool trans_a, bool trans_b, int m, int n, int k, const T* a, int lda, const T* b, int ldb, T beta, T* c,
               int ldc) {
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < n; ++j) {
      T acc = 0;
      for (int p = 0; p < k; ++p) {
        const T x = trans_a ? a[static_cast<size_t>(p) * lda + i] : a[static_cast<size_t>(i) * lda + p];
        const T y = trans_b ? b[static_cast<size_t>(j) * ldb + p] : b[static_cast<size_t>(p) * ldb + j];
        acc += x * y;
      }
      T& out = c[static_cast<size_t>(i) * ldc + j];
      out = beta == T(0) ? acc : acc + beta * out;
    }
}

template <class T>
class HostBackend {
 public:
  explicit HostBackend(GemmFunction<T> gemm = &loop_gemm<T>, bool reverse = false) : gemm_(gemm), reverse_(reverse) {}

  template <class Item>
  void each(size_t n, const Item& item) {
    if (reverse_)
      for (size_t i = n; i-- > 0;) item(i);
    else
      for (size_t i = 0; i < n; ++i) item(i);
  }
  void gemm(bool trans_a, bool trans_b, int m, int n, int k, const T* a, int lda, const T* b, int ldb, T beta, T* c,
            int ldc) {
    gemm_(trans_a, trans_b, m, n, k, a, lda, b, ldb, beta, c, ldc);
  }
  // model.hpp's matmul_forward: the bias in every row, then the product added.
  void matmul_bias(T* out, const T* inp, const T* w, const T* bias, int rows, int C, int OC) {
    each(static_cast<size_t>(rows) * OC, BiasRows<T>{out, bias, OC});
    gemm_(false, true, rows, OC, C, inp, C, w, C, T(1), out, OC);
  }

  template <class U>
  U* alloc(size_t n) {
    bytes_ += n * sizeof(U);
    blocks_.emplace_back(new unsigned char[n * sizeof(U) + 1]());
    return reinterpret_cast<U*>(blocks_.back().get());
  }
  void zero(void* p, size_t bytes) { std::memset(p, 0, bytes); }
  void copy(void* dst, const void* src, size_t bytes) { std::memcpy(dst, src, bytes); }
  void upload(void* dst, const void* src, size_t bytes) { std::memcpy(dst, src, bytes); }
  void download(void* dst, const void* src, size_t bytes) { std::memcpy(dst, src, bytes); }
  void* stream() { return nullptr; }
  size_t bytes() const { return bytes_; }
  const char* describe() const { return "the CPU (the device layers run item by item)"; }

 private:
  GemmFunction<T> gemm_;
  bool reverse_;
  std::vector<std::unique_ptr<unsigned char[]>> blocks_;
  size_t bytes_ = 0;
};

}  // namespace device
}  // namespace gpt
