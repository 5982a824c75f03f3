// The fused optimizer step on the GPU: one thread block per chunk of the launch table (cuda/launch_table.hpp), one
// thread per element, running kernels/step_element.hpp's step_vector on kernels/element_ops.hpp's one-element vector
// type — the source the CPU's portable path compiles — so every element gets the CPU's operations in the CPU's
// order, each correctly rounded (no FMA contraction: the _rn intrinsics; the build passes -fmad=false as well).
#include <climits>
#include <string>

#include "cuda/cuda_check.hpp"
#include "cuda/device_kernels.hpp"
#include "kernels/element_ops.hpp"
#include "kernels/step_element.hpp"

namespace zero {
namespace cuda {
namespace {

using kernel_detail::ElementV;
using kernel_detail::kSgdFirstStep;
using kernel_detail::kSgdMomentum;
using kernel_detail::kSgdNesterov;

constexpr int kThreads = 256;

template <OptimizerKind K, DType G, CopyMode C, int kSgd>
__global__ void __launch_bounds__(kThreads) step_chunks(const KernelArgs* segments, const StepChunk* chunks) {
  const StepChunk chunk = chunks[blockIdx.x];
  KernelArgs a = segments[chunk.segment];
  a.s.seed = chunk_seed(a, chunk);
  ElementV::D no_norm{};  // the norm is its own pass on the GPU (launch_sum_squares)
  for (uint32_t j = threadIdx.x; j < chunk.count; j += kThreads)
    kernel_detail::step_vector<ElementV, K, G>(a, chunk.begin + j, no_norm, 0,
                                               kernel_detail::FixedVariant<C, kSgd, false>{});
}

using Launcher = void (*)(const KernelArgs*, const StepChunk*, unsigned, cudaStream_t);

template <OptimizerKind K, DType G, CopyMode C, int kSgd>
void launch_chunks(const KernelArgs* segments, const StepChunk* chunks, unsigned blocks, cudaStream_t stream) {
  step_chunks<K, G, C, kSgd><<<blocks, kThreads, 0, stream>>>(segments, chunks);
}

// [optimizer][grad dtype][copy mode][SGD variant: the kSgd* flags, 0..7]; null where no variant exists.
struct LauncherTable {
  Launcher at[kNumOptimizerKinds][3][kNumCopyModes][8] = {};
};

template <OptimizerKind K, DType G, CopyMode C>
void fill_variants(LauncherTable& t) {
  Launcher* v = t.at[static_cast<int>(K)][static_cast<int>(G)][static_cast<int>(C)];
  v[0] = launch_chunks<K, G, C, 0>;
  if constexpr (K == OptimizerKind::kSgd) {
    v[kSgdMomentum] = launch_chunks<K, G, C, kSgdMomentum>;
    v[kSgdMomentum | kSgdFirstStep] = launch_chunks<K, G, C, kSgdMomentum | kSgdFirstStep>;
    v[kSgdMomentum | kSgdNesterov] = launch_chunks<K, G, C, kSgdMomentum | kSgdNesterov>;
    v[kSgdMomentum | kSgdFirstStep | kSgdNesterov] =
        launch_chunks<K, G, C, kSgdMomentum | kSgdFirstStep | kSgdNesterov>;
  }
}

template <OptimizerKind K, DType G>
void fill_copies(LauncherTable& t) {
  fill_variants<K, G, CopyMode::kNone>(t);
  fill_variants<K, G, CopyMode::kBf16Rne>(t);
  fill_variants<K, G, CopyMode::kBf16Stochastic>(t);
  fill_variants<K, G, CopyMode::kFp16Rne>(t);
}

template <OptimizerKind K>
void fill_grads(LauncherTable& t) {
  fill_copies<K, DType::kF32>(t);
  fill_copies<K, DType::kBF16>(t);
  fill_copies<K, DType::kF16>(t);
}

const LauncherTable& launchers() {
  static const LauncherTable table = [] {
    LauncherTable t;
    fill_grads<OptimizerKind::kAdamW>(t);
    fill_grads<OptimizerKind::kAdamL2>(t);
    fill_grads<OptimizerKind::kAdagrad>(t);
    fill_grads<OptimizerKind::kLion>(t);
    fill_grads<OptimizerKind::kSgd>(t);
    return t;
  }();
  return table;
}

}  // namespace

void launch_step(OptimizerKind kind, DType grad, CopyMode copy, const LaunchTable& table,
                 const KernelArgs* device_segments, const StepChunk* device_chunks, void* stream) {
  for (const StepLaunch& launch : table.launches) {
    if (launch.chunk_count == 0) continue;
    if (launch.chunk_count > INT_MAX)
      fail(ZERO_ERR_UNSUPPORTED, "a fused GPU step of " + std::to_string(launch.chunk_count) +
                                     " chunks exceeds the grid limit; plan it with larger chunks");
    if (launch.sgd_variant < 0 || launch.sgd_variant > 7)
      fail(ZERO_ERR_INTERNAL, "launch_step: SGD variant " + std::to_string(launch.sgd_variant));
    const Launcher launcher =
        launchers().at[static_cast<int>(kind)][static_cast<int>(grad)][static_cast<int>(copy)][launch.sgd_variant];
    if (launcher == nullptr)
      fail(ZERO_ERR_INTERNAL, "launch_step: no GPU kernel for SGD variant " + std::to_string(launch.sgd_variant));
    launcher(device_segments, device_chunks + launch.first_chunk, static_cast<unsigned>(launch.chunk_count),
             as_stream(stream));
    check_launch("the fused optimizer step kernel");
  }
}

}  // namespace cuda
}  // namespace zero
