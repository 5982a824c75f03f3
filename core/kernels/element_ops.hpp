// One element per "vector": the portable CPU path's vector type, and the GPU kernels' (cuda/step_kernels.cu), so
// that both run kernels/step_element.hpp with the same operations. Every operation is a single correctly rounded IEEE
// operation: on the CPU, plain operators in files compiled without FMA contraction (kernels/no_fp_contraction.hpp);
// on the GPU, the _rn intrinsics, which nvcc never contracts into an FMA (its default, -fmad=true, would contract
// a * b + c), and correctly rounded division and square root whatever -prec-div / -prec-sqrt say.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "numeric/dtype.hpp"
#include "numeric/host_device.hpp"

namespace zero {
namespace kernel_detail {

struct ElementV {
  static constexpr size_t W = 1;
  using F = float;
  // The norm's 16 fp64 lanes (step_element.hpp): element i of a 16-element block goes to lane i.
  struct D {
    double lane[16];
  };
  ZERO_HD_FORCEINLINE static F load(const float* p) { return *p; }
  ZERO_HD_FORCEINLINE static void store(float* p, F v) { *p = v; }
  ZERO_HD_FORCEINLINE static F set1(float v) { return v; }
#if defined(__CUDA_ARCH__)
  __device__ __forceinline__ static F add(F a, F b) { return __fadd_rn(a, b); }
  __device__ __forceinline__ static F sub(F a, F b) { return __fsub_rn(a, b); }
  __device__ __forceinline__ static F mul(F a, F b) { return __fmul_rn(a, b); }
  __device__ __forceinline__ static F div(F a, F b) { return __fdiv_rn(a, b); }
  __device__ __forceinline__ static F sqrt(F a) { return __fsqrt_rn(a); }
  __device__ __forceinline__ static double square_add(double acc, double x) { return __dadd_rn(acc, __dmul_rn(x, x)); }
  __device__ __forceinline__ static double dadd(double a, double b) { return __dadd_rn(a, b); }
#else
  static F add(F a, F b) { return a + b; }
  static F sub(F a, F b) { return a - b; }
  static F mul(F a, F b) { return a * b; }
  static F div(F a, F b) { return a / b; }
  static F sqrt(F a) { return std::sqrt(a); }
  static double square_add(double acc, double x) { return acc + x * x; }
  static double dadd(double a, double b) { return a + b; }
#endif
  // m x sign(a), exactly: m >= 0 is the learning rate, and sign(0) = sign(NaN) = 0 gives +0.
  ZERO_HD_FORCEINLINE static F sign_times(F a, F m) { return a > 0.0f ? m : (a < 0.0f ? -m : 0.0f); }
  ZERO_HD_FORCEINLINE static F load_bf16(const uint16_t* p) { return bf16_to_float(*p); }
  ZERO_HD_FORCEINLINE static F load_fp16(const uint16_t* p) { return fp16_to_float(*p); }
  ZERO_HD_FORCEINLINE static void store_bf16_rne(uint16_t* p, F v) { *p = float_to_bf16_rne(v); }
  ZERO_HD_FORCEINLINE static void store_bf16_sr(uint16_t* p, F v, uint32_t seed, uint32_t index) {
    *p = float_to_bf16_sr(v, mix32(index ^ seed));
  }
  ZERO_HD_FORCEINLINE static void store_fp16_rne(uint16_t* p, F v) { *p = float_to_fp16_rne(v); }
  ZERO_HD_FORCEINLINE static D dzero() { return D{}; }
  ZERO_HD_FORCEINLINE static D accumulate_squares(D acc, F x, size_t part) {
    acc.lane[part] = square_add(acc.lane[part], static_cast<double>(x));
    return acc;
  }
  // The fixed tree over the 16 lanes: lane j plus lane j + 8, then pairwise.
  ZERO_HD_FORCEINLINE static double lanes_sum(const double* lane) {
    double t[8];
    for (int j = 0; j < 8; ++j) t[j] = dadd(lane[j], lane[j + 8]);
    return dadd(dadd(dadd(t[0], t[1]), dadd(t[2], t[3])), dadd(dadd(t[4], t[5]), dadd(t[6], t[7])));
  }
  ZERO_HD_FORCEINLINE static double dsum(const D& acc) { return lanes_sum(acc.lane); }
};

}  // namespace kernel_detail
}  // namespace zero
