// The GPU step's launch table (core/cuda/launch_table.hpp), on the CPU: every element of every segment is in
// exactly one chunk, chunks are no longer than asked, SGD's variants get a launch each, and stepping the chunks one
// by one with the shared element step (the CPU's portable path, whose element code the GPU kernel compiles) gives
// the bits of one pass per segment — the split the GPU makes changes nothing.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <vector>

#include "cuda/launch_table.hpp"
#include "kernels/kernels.hpp"
#include "kernels/optimizer.hpp"
#include "kernels/step_element.hpp"
#include "util/error.hpp"

namespace zero {
namespace {

struct Streams {
  std::vector<float> master, s0;
  std::vector<uint16_t> grad, copy;
};

// SGD segments: with momentum (Nesterov on even ones), without momentum every third, and an empty one.
std::vector<KernelArgs> sgd_segments(std::vector<Streams>& streams, const std::vector<size_t>& sizes) {
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<KernelArgs> args;
  streams.resize(sizes.size());
  for (size_t i = 0; i < sizes.size(); ++i) {
    Streams& s = streams[i];
    const size_t n = sizes[i];
    s.master.resize(n);
    s.s0.resize(n);
    s.grad.resize(n);
    s.copy.assign(n, 0);
    for (size_t j = 0; j < n; ++j) {
      s.master[j] = normal(rng);
      s.s0[j] = normal(rng);
      s.grad[j] = float_to_bf16_rne(normal(rng));
    }
    OptimizerHyper h;
    h.kind = OptimizerKind::kSgd;
    h.lr = 0.01 * static_cast<double>(i + 1);
    h.momentum = i % 3 == 2 ? 0.0 : 0.9;
    h.nesterov = h.momentum != 0.0 && i % 2 == 0;
    KernelArgs a;
    a.master = s.master.data();
    a.grad = s.grad.data();
    a.grad_elem_size = 2;
    a.state0 = h.momentum != 0.0 ? s.s0.data() : nullptr;
    a.copy = s.copy.data();
    a.n = n;
    a.first_index = 1000 * i;
    a.s = make_step_scalars(h, 4, 2.0, 1.0);
    a.s.seed = 17;
    args.push_back(a);
  }
  return args;
}

TEST(LaunchTable, EveryElementIsInOneChunkAndEachVariantHasALaunch) {
  std::vector<Streams> streams;
  const std::vector<size_t> sizes = {5, 0, 4096, 4097, 1, 10000, 3};
  const std::vector<KernelArgs> segments = sgd_segments(streams, sizes);
  for (size_t chunk : {size_t{1}, size_t{7}, size_t{4096}, size_t{1} << 20}) {
    const cuda::LaunchTable t = cuda::plan_step_launches(OptimizerKind::kSgd, segments.data(), segments.size(), chunk);
    std::vector<std::vector<int>> seen(sizes.size());
    for (size_t s = 0; s < sizes.size(); ++s) seen[s].assign(sizes[s], 0);
    size_t next_chunk = 0;
    std::vector<int> variants;
    for (const cuda::StepLaunch& l : t.launches) {
      EXPECT_EQ(next_chunk, l.first_chunk);
      next_chunk += l.chunk_count;
      variants.push_back(l.sgd_variant);
      for (size_t c = l.first_chunk; c < l.first_chunk + l.chunk_count; ++c) {
        const cuda::StepChunk& ch = t.chunks[c];
        ASSERT_LT(ch.segment, sizes.size());
        EXPECT_EQ(l.sgd_variant, kernel_detail::sgd_variant(OptimizerKind::kSgd, segments[ch.segment]));
        EXPECT_GE(ch.count, 1u);
        EXPECT_LE(ch.count, chunk);
        for (size_t j = ch.begin; j < ch.begin + ch.count; ++j) ++seen[ch.segment].at(j);
      }
    }
    EXPECT_EQ(t.chunks.size(), next_chunk);
    for (size_t s = 0; s < sizes.size(); ++s)
      for (size_t j = 0; j < sizes[s]; ++j) ASSERT_EQ(1, seen[s][j]) << "segment " << s << " element " << j;
    // With momentum and Nesterov (segments 0, 4, 6), without momentum (2, 5), momentum alone (3; 1 is empty).
    std::sort(variants.begin(), variants.end());
    const std::vector<int> want = {0, kernel_detail::kSgdMomentum,
                                   kernel_detail::kSgdMomentum | kernel_detail::kSgdNesterov};
    EXPECT_EQ(want, variants) << "chunk " << chunk;
  }
  // Other optimizers: one launch.
  const cuda::LaunchTable adam = cuda::plan_step_launches(OptimizerKind::kAdamW, segments.data(), segments.size());
  EXPECT_EQ(1u, adam.launches.size());
}

// Segments 3 and 5 start 300 elements before a multiple of 2^32 and past one: the CPU keys stochastic rounding by
// the global index's high bits (parallel_step splits a run there); the chunks end there and take chunk_seed.
TEST(LaunchTable, SteppingTheChunksOneByOneGivesTheBitsOfOnePassPerSegment) {
  const std::vector<size_t> sizes = {5, 4097, 1, 10000, 3, 777};
  std::vector<Streams> whole, chunked;
  std::vector<KernelArgs> a = sgd_segments(whole, sizes), b = sgd_segments(chunked, sizes);
  for (std::vector<KernelArgs>* v : {&a, &b}) {
    (*v)[3].first_index = (uint64_t{1} << 32) - 300;
    (*v)[5].first_index = (uint64_t{3} << 32) + 5;
  }
  const StepKernel* table = kernel_table_scalar().step[static_cast<int>(OptimizerKind::kSgd)][2];
  const int copy = static_cast<int>(CopyMode::kBf16Stochastic);
  for (const KernelArgs& s : a) parallel_step(table[copy], s, 1);
  const cuda::LaunchTable t = cuda::plan_step_launches(OptimizerKind::kSgd, b.data(), b.size(), 1000);
  for (const cuda::StepChunk& ch : t.chunks) {
    const KernelArgs& segment = b[ch.segment];
    const uint64_t first = segment.first_index + ch.begin, last = first + ch.count - 1;
    ASSERT_EQ(first >> 32, last >> 32) << "a chunk crosses a multiple of 2^32";
    KernelArgs part = sub_run(segment, ch.begin, ch.count);
    part.s.seed = cuda::chunk_seed(segment, ch);
    table[copy](part);
  }
  for (size_t s = 0; s < sizes.size(); ++s) {
    EXPECT_EQ(whole[s].master, chunked[s].master) << s;
    EXPECT_EQ(whole[s].s0, chunked[s].s0) << s;
    EXPECT_EQ(whole[s].copy, chunked[s].copy) << s;
  }
}

TEST(LaunchTable, ImpossibleChunkSizesAreClearErrors) {
  KernelArgs a;
  a.n = 10;
  try {
    cuda::plan_step_launches(OptimizerKind::kAdamW, &a, 1, 0);
    FAIL() << "a chunk of 0 elements was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(ZERO_ERR_INVALID_ARGUMENT, e.status());
    EXPECT_NE(std::string::npos, std::string(e.what()).find("chunk")) << e.what();
  }
}

}  // namespace
}  // namespace zero
