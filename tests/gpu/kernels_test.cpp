// The GPU kernels against the CPU's, bit for bit: the fused step (every optimizer x gradient dtype x copy mode x
// SGD variant, several segments of odd sizes with their own step constants in one launch, chunks that cut them
// anywhere), special values, the norm's sum of squares, and the conversions. On a machine without a CUDA device
// every test reports itself skipped with the runtime's reason.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "cuda/device_kernels.hpp"
#include "cuda/launch_table.hpp"
#include "device_buffer.hpp"
#include "kernels/kernels.hpp"
#include "kernels/optimizer.hpp"
#include "numeric/dtype.hpp"
#include "util/error.hpp"

namespace zero {
namespace {

using gpu_test::DeviceBuffer;

class Gpu : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (!cuda::device_available(&why)) GTEST_SKIP() << "no CUDA device: " << why;
  }
};

// One segment's host streams, and their device copies.
struct Segment {
  std::vector<float> master, s0, s1;
  std::vector<uint16_t> copy;
  std::vector<uint8_t> grad;
  KernelArgs args;  // host pointers, for the CPU
};

const char* kKinds[] = {"AdamW", "AdamL2", "Adagrad", "Lion", "SGD"};
const char* kCopies[] = {"none", "bf16", "bf16-sr", "fp16"};

Segment make_segment(OptimizerKind kind, DType grad, CopyMode copy, size_t n, uint32_t seed, bool momentum,
                     bool nesterov, bool first_step) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  Segment s;
  s.master.resize(n);
  s.s0.resize(n);
  s.s1.resize(n);
  s.copy.assign(n, 0);
  s.grad.resize(n * dtype_size(grad));
  for (size_t i = 0; i < n; ++i) {
    s.master[i] = normal(rng);
    s.s0[i] = 0.1f * normal(rng);
    s.s1[i] = std::fabs(0.01f * normal(rng));
    if (kind == OptimizerKind::kAdagrad) s.s0[i] = std::fabs(s.s0[i]);
    const float g = normal(rng) * (i % 7 == 0 ? 1e-3f : 1.0f);
    if (grad == DType::kF32) std::memcpy(&s.grad[4 * i], &g, 4);
    const uint16_t h = grad == DType::kBF16 ? float_to_bf16_rne(g) : float_to_fp16_rne(g);
    if (grad != DType::kF32) std::memcpy(&s.grad[2 * i], &h, 2);
  }
  OptimizerHyper h;
  h.kind = kind;
  h.lr = (kind == OptimizerKind::kLion ? 1e-4 : 1e-2) * (1.0 + seed % 5);  // each segment its own group
  h.beta2 = kind == OptimizerKind::kLion ? 0.99 : 0.999;
  h.eps = kind == OptimizerKind::kAdagrad ? 1e-10 : 1e-8;
  h.weight_decay = 0.01 * (seed % 3);
  h.momentum = momentum ? 0.9 : 0.0;
  h.dampening = 0.1;
  h.nesterov = nesterov;
  KernelArgs& a = s.args;
  a.master = s.master.data();
  a.grad = s.grad.data();
  a.grad_elem_size = dtype_size(grad);
  a.state0 = state_count(h) > 0 ? s.s0.data() : nullptr;
  a.state1 = state_count(h) > 1 ? s.s1.data() : nullptr;
  a.copy = copy == CopyMode::kNone ? nullptr : s.copy.data();
  a.n = n;
  a.first_index = (uint64_t{seed} << 20) + 3;
  a.s = make_step_scalars(h, first_step ? 1 : 3, 6.0, 0.75);
  if (kind == OptimizerKind::kSgd) a.s.sgd.first_step = first_step;
  a.s.seed = 0x9e3779b9u ^ seed;
  return s;
}

// The device copies of a segment's streams, and its KernelArgs with device pointers.
struct DeviceSegment {
  DeviceBuffer<float> master, s0, s1;
  DeviceBuffer<uint16_t> copy;
  DeviceBuffer<uint8_t> grad;
  KernelArgs args;
  explicit DeviceSegment(const Segment& s)
      : master(s.master), s0(s.s0), s1(s.s1), copy(s.copy), grad(s.grad), args(s.args) {
    args.master = master.get();
    args.grad = grad.get();
    args.state0 = s.args.state0 ? s0.get() : nullptr;
    args.state1 = s.args.state1 ? s1.get() : nullptr;
    args.copy = s.args.copy ? copy.get() : nullptr;
  }
};

// Steps `segments` on the CPU (the portable path, which every SIMD path equals) and in one fused GPU step planned
// with `chunk_elems`, and compares every stream bit for bit.
void expect_same_step(OptimizerKind kind, DType grad, CopyMode copy, std::vector<Segment> segments, size_t chunk_elems,
                      const std::string& what) {
  for (Segment& s : segments) {  // the copies' own streams
    s.args.master = s.master.data();
    s.args.grad = s.grad.data();
    if (s.args.state0) s.args.state0 = s.s0.data();
    if (s.args.state1) s.args.state1 = s.s1.data();
    if (s.args.copy) s.args.copy = s.copy.data();
  }
  std::vector<std::unique_ptr<DeviceSegment>> device;
  std::vector<KernelArgs> device_args;
  for (const Segment& s : segments) {
    device.push_back(std::make_unique<DeviceSegment>(s));
    device_args.push_back(device.back()->args);
  }
  const cuda::LaunchTable table = cuda::plan_step_launches(kind, device_args.data(), device_args.size(), chunk_elems);
  DeviceBuffer<KernelArgs> args_on_device(device_args);
  DeviceBuffer<cuda::StepChunk> chunks_on_device(table.chunks);
  cuda::launch_step(kind, grad, copy, table, args_on_device.get(), chunks_on_device.get(), nullptr);
  for (Segment& s : segments)
    kernel_table_scalar().step[static_cast<int>(kind)][static_cast<int>(grad)][static_cast<int>(copy)](s.args);
  for (size_t i = 0; i < segments.size(); ++i) {
    const Segment& want = segments[i];
    const size_t n = want.master.size();
    const std::string where = what + ", segment " + std::to_string(i) + " of " + std::to_string(n);
    ASSERT_EQ(0, std::memcmp(want.master.data(), device[i]->master.download().data(), 4 * n)) << where << ": master";
    ASSERT_EQ(0, std::memcmp(want.s0.data(), device[i]->s0.download().data(), 4 * n)) << where << ": state 0";
    ASSERT_EQ(0, std::memcmp(want.s1.data(), device[i]->s1.download().data(), 4 * n)) << where << ": state 1";
    ASSERT_EQ(0, std::memcmp(want.copy.data(), device[i]->copy.download().data(), 2 * n)) << where << ": copy";
  }
}

TEST_F(Gpu, TheFusedStepEqualsTheCpuKernelsBitForBit) {
  const std::vector<size_t> sizes = {1, 17, 4095, 4097, 10007, 65537};
  for (int k = 0; k < kNumOptimizerKinds; ++k)
    for (DType g : {DType::kF32, DType::kBF16, DType::kF16})
      for (int m = 0; m < kNumCopyModes; ++m) {
        const auto kind = static_cast<OptimizerKind>(k);
        const auto copy = static_cast<CopyMode>(m);
        // SGD: segments with and without momentum, with and without Nesterov, in one step (several launches).
        std::vector<Segment> segments;
        for (size_t i = 0; i < sizes.size(); ++i)
          segments.push_back(make_segment(kind, g, copy, sizes[i], static_cast<uint32_t>(7 * i + k + 1), i % 3 != 2,
                                          i % 2 == 0, false));
        const std::string what = std::string(kKinds[k]) + " grad " + dtype_name(g) + " copy " + kCopies[m];
        expect_same_step(kind, g, copy, segments, cuda::kDefaultChunkElems, what);
        expect_same_step(kind, g, copy, segments, 1000, what + " (chunks of 1000)");
        if (kind == OptimizerKind::kSgd) {
          std::vector<Segment> first;
          for (size_t i = 0; i < sizes.size(); ++i)
            first.push_back(
                make_segment(kind, g, copy, sizes[i], static_cast<uint32_t>(i + 50), true, i % 2 == 0, true));
          expect_same_step(kind, g, copy, first, cuda::kDefaultChunkElems, what + " (first step)");
        }
      }
}

TEST_F(Gpu, SpecialValuesRoundAsOnTheCpu) {
  // Denormals, NaNs, infinities and values that round to infinity, as masters of an SGD step with lr 0.
  const std::vector<uint32_t> bits = {0x00000001u, 0x00400000u, 0x807fffffu, 0x00800000u, 0x7fc00001u, 0xffa00000u,
                                      0x7f800000u, 0xff800000u, 0x7f7fffffu, 0x477ff000u, 0x33000000u, 0x38800001u,
                                      0x3f808000u, 0x3f818000u, 0x00000000u, 0x80000000u, 0x00018000u};
  for (int m = 1; m < kNumCopyModes; ++m) {
    Segment s =
        make_segment(OptimizerKind::kSgd, DType::kF16, static_cast<CopyMode>(m), bits.size(), 1, false, false, false);
    for (size_t i = 0; i < bits.size(); ++i) s.master[i] = bits_float(bits[i]);
    // Gradients that are denormal, infinite or NaN in fp16.
    const std::vector<uint16_t> grads = {0x0001u, 0x03ffu, 0x7c00u, 0xfc00u, 0x7e01u, 0x8001u};
    for (size_t i = 0; i < bits.size(); ++i) std::memcpy(&s.grad[2 * i], &grads[i % grads.size()], 2);
    OptimizerHyper h;
    h.kind = OptimizerKind::kSgd;
    h.lr = 0.0;
    s.args.s = make_step_scalars(h, 1, 1.0, 1.0);
    expect_same_step(OptimizerKind::kSgd, DType::kF16, static_cast<CopyMode>(m), {s}, cuda::kDefaultChunkElems,
                     std::string("special values, copy ") + kCopies[m]);
  }
}

TEST_F(Gpu, TheSumOfSquaresHasTheCpuBits) {
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (DType g : {DType::kF32, DType::kBF16, DType::kF16})
    for (size_t n : {size_t{0}, size_t{1}, size_t{15}, size_t{16}, size_t{17}, kSumBlockElems - 1, kSumBlockElems,
                     kSumBlockElems + 1, 3 * kSumBlockElems + 5, 300 * kSumBlockElems + 7})
      for (bool non_finite : {false, true}) {
        std::vector<uint8_t> grad(n * dtype_size(g));
        for (size_t i = 0; i < n; ++i) {
          // Magnitudes over many binades, so that the order of the additions shows in the bits.
          float x = normal(rng) * std::ldexp(1.0f, static_cast<int>(i % 23) - 11);
          if (non_finite && i == n / 2) x = i % 2 ? INFINITY : NAN;
          const uint16_t h = g == DType::kBF16 ? float_to_bf16_rne(x) : float_to_fp16_rne(x);
          std::memcpy(&grad[i * dtype_size(g)], g == DType::kF32 ? static_cast<const void*>(&x) : &h, dtype_size(g));
        }
        std::vector<double> scratch(sum_squares_blocks(n));
        const double want = parallel_sum_squares(kernel_table_scalar().sum_squares[static_cast<int>(g)], grad.data(),
                                                 dtype_size(g), n, 2, scratch.data());
        DeviceBuffer<uint8_t> device_grad(grad);
        DeviceBuffer<double> device_scratch(cuda::sum_squares_scratch_doubles(n) + 1), result(1);
        cuda::launch_sum_squares(g, device_grad.get(), n, device_scratch.get(), result.get(), nullptr);
        const double got = result.download()[0];
        EXPECT_EQ(0, std::memcmp(&want, &got, sizeof got))
            << dtype_name(g) << " n " << n << (non_finite ? " with a non-finite value" : "") << ": CPU " << want
            << ", GPU " << got;
      }
}

TEST_F(Gpu, ConversionsHaveTheCpuBits) {
  // Every 16-bit pattern widened; fp32 values of every kind narrowed; accumulation into values and into zero.
  std::vector<uint16_t> every(65536);
  for (size_t i = 0; i < every.size(); ++i) every[i] = static_cast<uint16_t>(i);
  std::vector<float> floats(1 << 20);
  std::mt19937 rng(9);
  for (float& f : floats) f = bits_float(static_cast<uint32_t>(rng()));  // every exponent, NaNs and denormals too
  for (DType d : {DType::kBF16, DType::kF16}) {
    const int di = static_cast<int>(d);
    std::vector<float> widened(every.size());
    kernel_table_scalar().widen[di](widened.data(), every.data(), every.size());
    DeviceBuffer<uint16_t> device_every(every);
    DeviceBuffer<float> device_widened(every.size());
    cuda::launch_widen(d, device_widened.get(), device_every.get(), every.size(), nullptr);
    EXPECT_EQ(0, std::memcmp(widened.data(), device_widened.download().data(), 4 * every.size())) << dtype_name(d);

    std::vector<uint16_t> narrowed(floats.size());
    kernel_table_scalar().narrow[di](narrowed.data(), floats.data(), floats.size());
    DeviceBuffer<float> device_floats(floats);
    DeviceBuffer<uint16_t> device_narrowed(floats.size());
    cuda::launch_narrow(d, device_narrowed.get(), device_floats.get(), floats.size(), nullptr);
    EXPECT_EQ(narrowed, device_narrowed.download()) << dtype_name(d);

    for (bool into_zero : {false, true}) {
      std::vector<float> acc(every.size());
      for (size_t i = 0; i < acc.size(); ++i) acc[i] = floats[i];
      DeviceBuffer<float> device_acc(acc);
      (into_zero ? kernel_table_scalar().accumulate_into_zero : kernel_table_scalar().accumulate)[di](
          acc.data(), every.data(), every.size());
      cuda::launch_accumulate(d, device_acc.get(), device_every.get(), every.size(), into_zero, nullptr);
      EXPECT_EQ(0, std::memcmp(acc.data(), device_acc.download().data(), 4 * acc.size()))
          << dtype_name(d) << (into_zero ? " into zero" : "");
    }
  }
}

TEST(GpuArguments, OverlappingConversionsAreRefusedBeforeAnyDeviceIsTouched) {
  std::vector<float> buffer(64);
  try {
    cuda::launch_narrow(DType::kBF16, buffer.data(), buffer.data(), buffer.size(), nullptr);
    FAIL() << "an in-place narrowing was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(ZERO_ERR_INVALID_ARGUMENT, e.status());
    EXPECT_NE(std::string::npos, std::string(e.what()).find("must not overlap")) << e.what();
  }
}

}  // namespace
}  // namespace zero
