// The portable path: one element per "vector", the reference the SIMD paths must match bit for bit.
#include <cmath>

#include "optim/kernel_body.hpp"

namespace zero {
namespace {

struct ScalarV {
  static constexpr size_t W = 1;
  using F = float;
  using D = double;
  static F load(const float* p) { return *p; }
  static void store(float* p, F v) { *p = v; }
  static F set1(float v) { return v; }
  static F add(F a, F b) { return a + b; }
  static F sub(F a, F b) { return a - b; }
  static F mul(F a, F b) { return a * b; }
  static F div(F a, F b) { return a / b; }
  static F sqrt(F a) { return std::sqrt(a); }
  // m x sign(a), exactly: m >= 0 is the learning rate, and sign(0) = sign(NaN) = 0 gives +0.
  static F sign_times(F a, F m) { return a > 0.0f ? m : (a < 0.0f ? -m : 0.0f); }
  static F load_bf16(const uint16_t* p) { return bf16_to_float(*p); }
  static F load_fp16(const uint16_t* p) { return fp16_to_float(*p); }
  static void store_bf16_rne(uint16_t* p, F v) { *p = float_to_bf16_rne(v); }
  static void store_bf16_sr(uint16_t* p, F v, uint32_t seed, uint32_t index) {
    *p = float_to_bf16_sr(v, mix32(index ^ seed));
  }
  static void store_fp16_rne(uint16_t* p, F v) { *p = float_to_fp16_rne(v); }
  static D dzero() { return 0.0; }
  static D accumulate_squares(D acc, F x) { return acc + static_cast<double>(x) * static_cast<double>(x); }
  static double dsum(D acc) { return acc; }
};

}  // namespace

const KernelTable& kernel_table_scalar() {
  static const KernelTable table = kernel_detail::make_table<ScalarV>();
  return table;
}

}  // namespace zero
