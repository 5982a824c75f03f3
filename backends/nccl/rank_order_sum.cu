// The deterministic reduce-scatter's sum on the device: this rank's block of every rank's input (its own in place,
// the others' received into scratch), added in rank order 0, 1, ..., N-1 in fp32 and rounded once to the dtype — the
// arithmetic of core/comm/rank_order_sum.cpp (a sum starts as rank 0's value, not 0 + it, so a zero's sign
// survives), so the bits are the CPU engine's and the host communicators'.
#include <cstdint>

#include "numeric/dtype.hpp"
#include "rank_order_sum.hpp"

namespace zero {
namespace nccl {
namespace {

struct Bf16Bits {
  uint16_t bits;
};
struct Fp16Bits {
  uint16_t bits;
};

// The CPU engine's conversions themselves (numeric/dtype.hpp, compiled for the device too): NaN payloads included.
template <typename T>
__device__ float widen(T v);
template <>
__device__ float widen<float>(float v) {
  return v;
}
template <>
__device__ float widen<Bf16Bits>(Bf16Bits v) {
  return bf16_to_float(v.bits);
}
template <>
__device__ float widen<Fp16Bits>(Fp16Bits v) {
  return fp16_to_float(v.bits);
}

template <typename T>
__device__ T narrow(float v);
template <>
__device__ float narrow<float>(float v) {
  return v;
}
template <>
__device__ Bf16Bits narrow<Bf16Bits>(float v) {
  return Bf16Bits{float_to_bf16_rne(v)};
}
template <>
__device__ Fp16Bits narrow<Fp16Bits>(float v) {
  return Fp16Bits{float_to_fp16_rne(v)};
}

template <typename T>
__global__ void sum_blocks(T* own, const T* received, size_t count, int ranks, int me) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride) {
    float sum = widen<T>(me == 0 ? own[i] : received[i]);
    for (int r = 1; r < ranks; ++r) sum += widen<T>(r == me ? own[i] : received[static_cast<size_t>(r) * count + i]);
    own[i] = narrow<T>(sum);
  }
}

template <typename T>
cudaError_t launch(void* own, const void* received, size_t count, int ranks, int me, cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  constexpr unsigned kThreads = 256;
  const size_t wanted = (count + kThreads - 1) / kThreads;
  const unsigned blocks = static_cast<unsigned>(wanted < 4096 ? wanted : 4096);
  sum_blocks<T>
      <<<blocks, kThreads, 0, stream>>>(static_cast<T*>(own), static_cast<const T*>(received), count, ranks, me);
  return cudaGetLastError();
}

}  // namespace

cudaError_t sum_received_in_rank_order(SumType type, void* own, const void* received, size_t count, int ranks, int me,
                                       cudaStream_t stream) {
  switch (type) {
    case SumType::kF32:
      return launch<float>(own, received, count, ranks, me, stream);
    case SumType::kBF16:
      return launch<Bf16Bits>(own, received, count, ranks, me, stream);
    case SumType::kF16:
      return launch<Fp16Bits>(own, received, count, ranks, me, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace nccl
}  // namespace zero
