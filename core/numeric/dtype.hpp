// Element types and exact scalar conversions. The rounding libzero promises for every compute-dtype copy, on
// every SIMD path: IEEE round-to-nearest-even from fp32, denormals kept (not flushed), overflow to infinity, a
// NaN stays a quiet NaN with the top of its payload. The SIMD kernels are tested against these functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "numeric/host_device.hpp"
#include "zero/zero.h"

namespace zero {

// What the engine computes in and keeps its buffers in. kU8 is raw bytes: the frozen params' buffers, which hold
// every frozen param's elements as they are and are never converted.
enum class DType { kF32 = ZERO_DTYPE_FP32, kBF16 = ZERO_DTYPE_BF16, kF16 = ZERO_DTYPE_FP16, kU8 = ZERO_DTYPE_UINT8 };

constexpr size_t dtype_size(DType t) { return t == DType::kF32 ? 4 : t == DType::kU8 ? 1 : 2; }
inline const char* dtype_name(DType t) {
  return t == DType::kF32 ? "fp32" : t == DType::kBF16 ? "bf16" : t == DType::kF16 ? "fp16" : "u8";
}

// A frozen param's element type (ZERO_PARAM_FROZEN): any zero_dtype_t. Its bytes are stored, moved and saved as
// they are; the type says only how many bytes an element has and what checkpoints call it.
enum class StoredType : int32_t {
  kF32 = ZERO_DTYPE_FP32,
  kBF16 = ZERO_DTYPE_BF16,
  kF16 = ZERO_DTYPE_FP16,
  kF64 = ZERO_DTYPE_FP64,
  kI64 = ZERO_DTYPE_INT64,
  kU8 = ZERO_DTYPE_UINT8,
  kI8 = ZERO_DTYPE_INT8,
  kBytes = ZERO_DTYPE_BYTES
};
constexpr bool stored_type_valid(int32_t code) { return code >= ZERO_DTYPE_FP32 && code <= ZERO_DTYPE_BYTES; }
constexpr size_t stored_size(StoredType t) {
  switch (t) {
    case StoredType::kF32:
      return 4;
    case StoredType::kBF16:
    case StoredType::kF16:
      return 2;
    case StoredType::kF64:
    case StoredType::kI64:
      return 8;
    case StoredType::kU8:
    case StoredType::kI8:
    case StoredType::kBytes:
      return 1;
  }
  return 1;
}
// The names checkpoints' manifests use (the trained dtypes' names are dtype_name's).
inline const char* stored_name(StoredType t) {
  switch (t) {
    case StoredType::kF32:
      return "fp32";
    case StoredType::kBF16:
      return "bf16";
    case StoredType::kF16:
      return "fp16";
    case StoredType::kF64:
      return "fp64";
    case StoredType::kI64:
      return "int64";
    case StoredType::kU8:
      return "uint8";
    case StoredType::kI8:
      return "int8";
    case StoredType::kBytes:
      return "bytes";
  }
  return "?";
}
// Sets *out and returns true when `name` is one of stored_name's.
inline bool stored_from_name(const std::string& name, StoredType* out) {
  for (int32_t code = ZERO_DTYPE_FP32; code <= ZERO_DTYPE_BYTES; ++code)
    if (name == stored_name(static_cast<StoredType>(code))) {
      *out = static_cast<StoredType>(code);
      return true;
    }
  return false;
}
// What safetensors calls it (opaque bytes are U8).
inline const char* stored_safetensors_dtype(StoredType t) {
  switch (t) {
    case StoredType::kF32:
      return "F32";
    case StoredType::kBF16:
      return "BF16";
    case StoredType::kF16:
      return "F16";
    case StoredType::kF64:
      return "F64";
    case StoredType::kI64:
      return "I64";
    case StoredType::kU8:
    case StoredType::kBytes:
      return "U8";
    case StoredType::kI8:
      return "I8";
  }
  return "U8";
}

ZERO_HD inline uint32_t float_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
#endif
}
ZERO_HD inline float bits_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}

ZERO_HD inline float bf16_to_float(uint16_t h) { return bits_float(static_cast<uint32_t>(h) << 16); }

ZERO_HD inline uint16_t float_to_bf16_rne(float f) {
  uint32_t u = float_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

// Stochastic rounding: adds 16 random bits below the kept mantissa and truncates, so the result rounds up with
// probability equal to the discarded fraction (unbiased). `random` is uniform in [0, 2^16).
ZERO_HD inline uint16_t float_to_bf16_sr(float f, uint32_t random) {
  uint32_t u = float_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);
  if ((u & 0x7fffffffu) == 0x7f800000u) return static_cast<uint16_t>(u >> 16);  // infinities stay
  return static_cast<uint16_t>((u + (random & 0xffffu)) >> 16);
}

ZERO_HD inline float fp16_to_float(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
  // inf, or a NaN, quieted as F16C's vcvtph2ps quiets it (the SIMD paths widen with it)
  if (exp == 0x1f) return bits_float(sign | 0x7f800000u | (mant << 13) | (mant != 0 ? 0x00400000u : 0u));
  if (exp != 0) return bits_float(sign | ((exp + 112) << 23) | (mant << 13));
    // Zero or denormal: mant x 2^-24, exact in fp32.
#if defined(__CUDA_ARCH__)
  const float v = __fmul_rn(static_cast<float>(mant), 5.9604644775390625e-8f);  // never fused with what follows
#else
  const float v = static_cast<float>(mant) * 5.9604644775390625e-8f;
#endif
  return sign ? -v : v;
}

ZERO_HD inline uint16_t float_to_fp16_rne(float f) {
  uint32_t u = float_bits(f);
  uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u | ((a >> 13) & 0x3ffu));  // quiet NaN
  if (a >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to >= 65520: infinity
  if (a < 0x38800000u) {
    // Result is a half denormal (or zero): round a x 2^24 to an integer, to nearest even.
    if (a < 0x33000000u) return sign;  // below half of the smallest denormal (2^-25): zero
    uint32_t e = a >> 23, m = (a & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126 - e;  // value = m x 2^(e-150); in units of 2^-24: m >> (126 - e)
    uint32_t q = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (q & 1u))) ++q;
    return static_cast<uint16_t>(sign | q);
  }
  uint32_t r = a - 0x38000000u;  // rebias exponent 127 -> 15
  r += 0xfffu + ((r >> 13) & 1u);
  return static_cast<uint16_t>(sign | (r >> 13));
}

// 32-bit hash used for stochastic rounding: deterministic per (seed, element index), so the rounding of an element
// does not depend on how the shards split the model.
ZERO_HD inline uint32_t mix32(uint32_t x) {
  x ^= x >> 16;
  x *= 0x7feb352du;
  x ^= x >> 15;
  x *= 0x846ca68bu;
  x ^= x >> 16;
  return x;
}

// Stochastic rounding hashes each element's 32 low index bits with a seed; the seed mixes the config's seed, the
// 64-bit step number and the element index's 32 high bits (a 32-bit hash of 32 bits: within one step, each block of
// 2^32 elements draws a permutation of the same values, which is all a rounding needs). The element index counts
// the model's elements without the padding (which depends on the rank count), so the rounding does not depend on
// how many ranks share the model.
ZERO_HD inline uint32_t sr_step_seed(uint32_t seed, uint64_t step) {
  return mix32(seed ^ static_cast<uint32_t>(step * 0x9e3779b9u) ^ mix32(static_cast<uint32_t>(step >> 32)));
}
// The seed of the elements whose index has the high bits of `index` (mix32(0) = 0: below 2^32, the step's seed).
ZERO_HD inline uint32_t sr_index_seed(uint32_t step_seed, uint64_t index) {
  return step_seed ^ mix32(static_cast<uint32_t>(index >> 32));
}

}  // namespace zero
