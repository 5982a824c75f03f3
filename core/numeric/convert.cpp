#include "numeric/convert.hpp"

#include <cstdint>
#include <cstring>

namespace zero {
namespace {

inline float load(const void* p, DType t, size_t i) {
  switch (t) {
    case DType::kF32:
      return static_cast<const float*>(p)[i];
    case DType::kBF16:
      return bf16_to_float(static_cast<const uint16_t*>(p)[i]);
    case DType::kF16:
      return fp16_to_float(static_cast<const uint16_t*>(p)[i]);
    case DType::kU8:  // bytes are never converted; the engine copies them
      break;
  }
  return 0.0f;
}

inline void store(void* p, DType t, size_t i, float v) {
  switch (t) {
    case DType::kF32:
      static_cast<float*>(p)[i] = v;
      break;
    case DType::kBF16:
      static_cast<uint16_t*>(p)[i] = float_to_bf16_rne(v);
      break;
    case DType::kF16:
      static_cast<uint16_t*>(p)[i] = float_to_fp16_rne(v);
      break;
    case DType::kU8:
      break;
  }
}

}  // namespace

void convert(void* dst, DType dst_type, const void* src, DType src_type, size_t n) {
  if (n == 0) return;  // the pointers of an empty range may be null
  if (dst_type == src_type) {
    std::memmove(dst, src, n * dtype_size(dst_type));
    return;
  }
  // Front to back is safe when writing never overtakes reading (narrowing in place); otherwise back to front.
  if (dtype_size(dst_type) <= dtype_size(src_type) && dst <= src) {
    for (size_t i = 0; i < n; ++i) store(dst, dst_type, i, load(src, src_type, i));
  } else {
    for (size_t i = n; i-- > 0;) store(dst, dst_type, i, load(src, src_type, i));
  }
}

void accumulate(void* acc, DType acc_type, const void* src, DType src_type, size_t n) {
  if (acc_type == DType::kF32 && src_type == DType::kF32) {
    float* a = static_cast<float*>(acc);
    const float* s = static_cast<const float*>(src);
    for (size_t i = 0; i < n; ++i) a[i] += s[i];
    return;
  }
  for (size_t i = 0; i < n; ++i) store(acc, acc_type, i, load(acc, acc_type, i) + load(src, src_type, i));
}

void accumulate_into_zero(void* acc, DType acc_type, const void* src, DType src_type, size_t n) {
  if (acc_type == DType::kF32 && src_type == DType::kF32) {
    float* a = static_cast<float*>(acc);
    const float* s = static_cast<const float*>(src);
    for (size_t i = 0; i < n; ++i) a[i] = 0.0f + s[i];
    return;
  }
  for (size_t i = 0; i < n; ++i) store(acc, acc_type, i, 0.0f + load(src, src_type, i));
}

void round_from_f32(void* dst, DType dst_type, const float* src, size_t n) {
  for (size_t i = 0; i < n; ++i) store(dst, dst_type, i, src[i]);
}

}  // namespace zero
