// The gradient norm's sum of squares on the GPU, with the CPU's bits (kernels/dispatch.cpp parallel_sum_squares):
// the run is cut into blocks of kSumBlockElems elements; in each block, element i's square (in fp64) is added to
// lane i mod 16 in element order, the 16 lanes are combined by the fixed tree, and the block sums are added in
// block order starting from 0. Each of those sums is a sequential chain on the CPU and stays one here — one thread
// per (block, lane), one per block's tree, one block for the ordered total — so the GPU computes the same chain of
// correctly rounded fp64 operations. The CPU pads a block's last 16 with zeros; adding the square of zero to a lane
// changes nothing (lanes start at +0 and only add non-negative squares or NaN), so the GPU skips them.
#include <algorithm>

#include "cuda/cuda_check.hpp"
#include "cuda/device_kernels.hpp"
#include "kernels/element_ops.hpp"
#include "kernels/step_element.hpp"

namespace zero {
namespace cuda {
namespace {

using kernel_detail::ElementV;
using kernel_detail::kSquareLanes;

constexpr int kThreads = 256;

template <DType G>
__global__ void __launch_bounds__(kThreads) square_lanes(const void* grad, size_t n, double* lanes) {
  const size_t t = static_cast<size_t>(blockIdx.x) * kThreads + threadIdx.x;
  const size_t block = t / kSquareLanes, lane = t % kSquareLanes;
  const size_t begin = block * kSumBlockElems;
  if (begin >= n) return;
  const size_t end = begin + kSumBlockElems < n ? begin + kSumBlockElems : n;
  double acc = 0.0;
  for (size_t i = begin + lane; i < end; i += kSquareLanes)
    acc = ElementV::square_add(acc, static_cast<double>(kernel_detail::load_grad<ElementV, G>(grad, i)));
  lanes[t] = acc;
}

__global__ void __launch_bounds__(kThreads) lane_trees(const double* lanes, size_t blocks, double* block_sums) {
  const size_t b = static_cast<size_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (b < blocks) block_sums[b] = ElementV::lanes_sum(lanes + b * kSquareLanes);
}

// One thread block: tiles of block sums are staged in shared memory by every thread, then added in order by one.
__global__ void __launch_bounds__(kThreads) ordered_total(const double* block_sums, size_t blocks, double* result) {
  __shared__ double tile[kThreads];
  double sum = 0.0;
  for (size_t base = 0; base < blocks; base += kThreads) {
    const size_t count = blocks - base < kThreads ? blocks - base : kThreads;
    if (threadIdx.x < count) tile[threadIdx.x] = block_sums[base + threadIdx.x];
    __syncthreads();
    if (threadIdx.x == 0)
      for (size_t j = 0; j < count; ++j) sum = ElementV::dadd(sum, tile[j]);
    __syncthreads();
  }
  if (threadIdx.x == 0) *result = sum;
}

unsigned grid_for(size_t threads) { return static_cast<unsigned>((threads + kThreads - 1) / kThreads); }

}  // namespace

void launch_sum_squares(DType grad, const void* device_grad, size_t n, double* scratch, double* result, void* stream) {
  cudaStream_t s = as_stream(stream);
  const size_t blocks = sum_squares_blocks(n);
  double* lanes = scratch;
  double* block_sums = scratch + blocks * kSquareLanes;
  if (blocks > 0) {
    const unsigned grid = grid_for(blocks * kSquareLanes);
    if (grad == DType::kF32) square_lanes<DType::kF32><<<grid, kThreads, 0, s>>>(device_grad, n, lanes);
    if (grad == DType::kBF16) square_lanes<DType::kBF16><<<grid, kThreads, 0, s>>>(device_grad, n, lanes);
    if (grad == DType::kF16) square_lanes<DType::kF16><<<grid, kThreads, 0, s>>>(device_grad, n, lanes);
    check_launch("the sum-of-squares kernel");
    lane_trees<<<grid_for(blocks), kThreads, 0, s>>>(lanes, blocks, block_sums);
    check_launch("the sum-of-squares lane tree kernel");
  }
  ordered_total<<<1, kThreads, 0, s>>>(block_sums, blocks, result);
  check_launch("the sum-of-squares total kernel");
}

}  // namespace cuda
}  // namespace zero
