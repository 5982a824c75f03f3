#include "device/emulated_kernels.hpp"

#include <algorithm>

#include "kernels/step_element.hpp"

namespace zero {
namespace device {
namespace emulated {
namespace {

const KernelTable& portable() { return kernel_table_scalar(); }

template <class T>
T* mapped(const std::function<void*(const void*)>& shadow, T* p) {
  return p == nullptr ? nullptr : static_cast<T*>(shadow(p));
}

}  // namespace

void step(OptimizerKind kind, DType grad, CopyMode copy_mode, const cuda::LaunchTable& table,
          const KernelArgs* segments, const cuda::StepChunk* chunks, const std::function<void*(const void*)>& shadow) {
  const StepKernel kernel =
      portable().step[static_cast<int>(kind)][static_cast<int>(grad)][static_cast<int>(copy_mode)];
  // A thread block per chunk on the GPU, each element on its own: any order of chunks gives the same bits.
  for (const cuda::StepLaunch& launch : table.launches) {
    for (size_t c = launch.first_chunk; c < launch.first_chunk + launch.chunk_count; ++c) {
      const cuda::StepChunk chunk = chunks[c];
      KernelArgs segment = segments[chunk.segment];
      segment.master = mapped(shadow, segment.master);
      segment.grad = mapped(shadow, segment.grad);
      segment.state0 = mapped(shadow, segment.state0);
      segment.state1 = mapped(shadow, segment.state1);
      segment.copy = mapped(shadow, segment.copy);
      KernelArgs part = sub_run(segment, chunk.begin, chunk.count);
      part.s.seed = cuda::chunk_seed(segments[chunk.segment], chunk);
      kernel(part);
    }
  }
}

void sum_squares(DType grad, const void* grads, size_t n, double* scratch, double* result) {
  const size_t blocks = sum_squares_blocks(n);
  double* block_sums = scratch + blocks * kernel_detail::kSquareLanes;  // where the GPU's lane trees write them
  const auto* base = static_cast<const unsigned char*>(grads);
  const size_t elem = dtype_size(grad);
  double total = 0.0;
  for (size_t b = 0; b < blocks; ++b) {
    const size_t begin = b * kSumBlockElems;
    block_sums[b] =
        portable().sum_squares[static_cast<int>(grad)](base + begin * elem, std::min(kSumBlockElems, n - begin));
    total += block_sums[b];
  }
  *result = total;
}

void narrow(DType to, void* dst, const float* src, size_t n) { portable().narrow[static_cast<int>(to)](dst, src, n); }

void widen(DType from, float* dst, const void* src, size_t n) { portable().widen[static_cast<int>(from)](dst, src, n); }

void accumulate(DType from, float* acc, const void* src, size_t n, bool into_zero) {
  const KernelTable& k = portable();
  (into_zero ? k.accumulate_into_zero : k.accumulate)[static_cast<int>(from)](acc, src, n);
}

}  // namespace emulated
}  // namespace device
}  // namespace zero
