// The portable path: one element per "vector", the reference the SIMD paths must match bit for bit.
#include "optim/no_fp_contraction.hpp"  // before anything else: no FMA contraction in this file

#include <cmath>

#include "optim/kernel_body.hpp"

namespace zero {
namespace {

struct ScalarV {
  static constexpr size_t W = 1;
  using F = float;
  struct D {
    double lane[16];
  };
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
  // The sum of squares' 16 fp64 lanes (kernel_body.hpp): element i of a 16-element block goes to lane i.
  static D dzero() { return D{}; }
  static D accumulate_squares(D acc, F x, size_t part) {
    acc.lane[part] = acc.lane[part] + static_cast<double>(x) * static_cast<double>(x);
    return acc;
  }
  static double dsum(const D& acc) {
    double t[8];
    for (int j = 0; j < 8; ++j) t[j] = acc.lane[j] + acc.lane[j + 8];
    return ((t[0] + t[1]) + (t[2] + t[3])) + ((t[4] + t[5]) + (t[6] + t[7]));
  }
};

}  // namespace

const KernelTable& kernel_table_scalar() {
  static const KernelTable table = kernel_detail::make_table<ScalarV>();
  return table;
}

}  // namespace zero
