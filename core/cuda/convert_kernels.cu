// Gradient conversions on the GPU with dtype.hpp's per-element functions — the CPU's portable path calls the same
// ones, and every CPU path equals it — plus the plain copy the kernel benchmark measures against.
#include <string>

#include "cuda/cuda_check.hpp"
#include "cuda/device_kernels.hpp"
#include "kernels/element_ops.hpp"
#include "memory/ops.hpp"
#include "numeric/dtype.hpp"

namespace zero {
namespace cuda {
namespace {

constexpr int kThreads = 256;

ZERO_HD_FORCEINLINE float load_as_float(DType d, const void* p, size_t i) {
  if (d == DType::kF32) return static_cast<const float*>(p)[i];
  const uint16_t h = static_cast<const uint16_t*>(p)[i];
  return d == DType::kBF16 ? bf16_to_float(h) : fp16_to_float(h);
}

__global__ void narrow(DType to, uint16_t* dst, const float* src, size_t n) {
  for (size_t i = static_cast<size_t>(blockIdx.x) * kThreads + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * kThreads)
    dst[i] = to == DType::kBF16 ? float_to_bf16_rne(src[i]) : float_to_fp16_rne(src[i]);
}

__global__ void widen(DType from, float* dst, const uint16_t* src, size_t n) {
  for (size_t i = static_cast<size_t>(blockIdx.x) * kThreads + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * kThreads)
    dst[i] = from == DType::kBF16 ? bf16_to_float(src[i]) : fp16_to_float(src[i]);
}

__global__ void accumulate(DType from, float* acc, const void* src, size_t n, bool into_zero) {
  for (size_t i = static_cast<size_t>(blockIdx.x) * kThreads + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * kThreads)
    acc[i] = kernel_detail::ElementV::add(into_zero ? 0.0f : acc[i], load_as_float(from, src, i));
}

__global__ void copy16(uint4* dst, const uint4* src, size_t n) {
  for (size_t i = static_cast<size_t>(blockIdx.x) * kThreads + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * kThreads)
    dst[i] = src[i];
}

// Enough blocks to fill the device several times over; the loops stride over the rest.
unsigned grid_for(size_t n) {
  const size_t blocks = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < 65536 ? (blocks == 0 ? 1 : blocks) : 65536);
}

void require_disjoint(const void* a, size_t a_bytes, const void* b, size_t b_bytes, const char* what) {
  if (ranges_overlap(a, a_bytes, b, b_bytes))
    fail(ZERO_ERR_INVALID_ARGUMENT, std::string(what) + ": on the GPU, source and destination must not overlap");
}

void require_16bit(DType d, const char* what) {
  if (d == DType::kF32) fail(ZERO_ERR_INVALID_ARGUMENT, std::string(what) + " takes a 16-bit dtype (bf16 or fp16)");
}

}  // namespace

void launch_narrow(DType to, void* dst, const float* src, size_t n, void* stream) {
  require_16bit(to, "launch_narrow");
  require_disjoint(dst, 2 * n, src, 4 * n, "launch_narrow");
  if (n == 0) return;
  narrow<<<grid_for(n), kThreads, 0, as_stream(stream)>>>(to, static_cast<uint16_t*>(dst), src, n);
  check_launch("the narrowing kernel");
}

void launch_widen(DType from, float* dst, const void* src, size_t n, void* stream) {
  require_16bit(from, "launch_widen");
  require_disjoint(dst, 4 * n, src, 2 * n, "launch_widen");
  if (n == 0) return;
  widen<<<grid_for(n), kThreads, 0, as_stream(stream)>>>(from, dst, static_cast<const uint16_t*>(src), n);
  check_launch("the widening kernel");
}

void launch_accumulate(DType from, float* acc, const void* src, size_t n, bool into_zero, void* stream) {
  require_disjoint(acc, 4 * n, src, dtype_size(from) * n, "launch_accumulate");
  if (n == 0) return;
  accumulate<<<grid_for(n), kThreads, 0, as_stream(stream)>>>(from, acc, src, n, into_zero);
  check_launch("the accumulation kernel");
}

void launch_copy(void* dst, const void* src, size_t n, void* stream) {
  if (n % 16 != 0 || reinterpret_cast<uintptr_t>(dst) % 16 != 0 || reinterpret_cast<uintptr_t>(src) % 16 != 0)
    fail(ZERO_ERR_INVALID_ARGUMENT, "launch_copy: 16-byte aligned buffers and a multiple of 16 bytes");
  if (n == 0) return;
  copy16<<<grid_for(n / 16), kThreads, 0, as_stream(stream)>>>(static_cast<uint4*>(dst), static_cast<const uint4*>(src),
                                                               n / 16);
  check_launch("the copy kernel");
}

}  // namespace cuda
}  // namespace zero
