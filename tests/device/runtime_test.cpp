// The device runtime (core/device/runtime.hpp). The first half runs on every runtime this machine has — the host
// emulator (two seeds of its random delays) and, where a GPU and the CUDA module are, CUDA: copies, stream-ordered
// pools, and the kernels against the CPU's bits. The second half is the emulator's own: its device memory faults
// when the host touches it and is checked at every use, released memory is reused in stream order, and its
// happens-before checker finds the bugs it exists for — a missing event, a buffer reused before its last use is
// ordered, a host read of pinned memory the device is still writing — and stays silent when events order the same
// accesses.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cuda/device_kernels.hpp"
#include "cuda/launch_table.hpp"
#include "device/cuda_module.hpp"
#include "device/emulator.hpp"
#include "device/stream_pool.hpp"
#include "kernels/kernels.hpp"
#include "kernels/optimizer.hpp"
#include "numeric/dtype.hpp"
#include "runtimes.hpp"
#include "util/error.hpp"

namespace zero {
namespace {

using device::Emulator;
using device::Event;
using device::Stream;

using testing_device::download;
using testing_device::emulator;
using testing_device::kTimeout;
using testing_device::OnEachRuntime;
using testing_device::upload;
using testing_device::what_of;

INSTANTIATE_TEST_SUITE_P(Runtimes, OnEachRuntime, testing_device::kEachRuntime, testing_device::runtime_name);

TEST_P(OnEachRuntime, CopiesAndZeroingThroughPinnedMemory) {
  device::Runtime* rt = rt_.get();
  {
    auto s = rt->create_stream("copy");
    auto done = rt->create_event();
    std::vector<float> values(1000);
    for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i) * 0.5f;
    auto* pinned = static_cast<float*>(rt->allocate_pinned(values.size() * 4));
    rt->host_access(pinned, values.size() * 4, true);
    std::memcpy(pinned, values.data(), values.size() * 4);
    auto* d = static_cast<float*>(rt->allocate(values.size() * 4, *s));
    rt->copy(d, pinned, values.size() * 4, *s);  // pinned: asynchronous
    rt->fill_zero(d + 10, 40, *s);
    rt->copy(pinned, d, values.size() * 4, *s);
    rt->record(*done, *s);
    rt->synchronize(*done, kTimeout, "the round trip");
    rt->host_access(pinned, values.size() * 4, false);
    for (size_t i = 0; i < values.size(); ++i) ASSERT_EQ(i >= 10 && i < 20 ? 0.0f : values[i], pinned[i]) << i;
    rt->release(d, *s);
    rt->release_pinned(pinned);
  }
}

struct StepCase {
  OptimizerKind kind;
  DType grad;
  CopyMode copy;
};

// One segment per size; segment 1 runs across element 2^32 (stochastic rounding is keyed by the index's high bits).
TEST_P(OnEachRuntime, TheStepGivesTheCpuBits) {
  const std::vector<size_t> sizes = {4099, 1, 70000, 0, 333};
  const StepCase cases[] = {{OptimizerKind::kAdamW, DType::kBF16, CopyMode::kBf16Stochastic},
                            {OptimizerKind::kAdamW, DType::kF32, CopyMode::kNone},
                            {OptimizerKind::kSgd, DType::kF16, CopyMode::kFp16Rne},
                            {OptimizerKind::kLion, DType::kBF16, CopyMode::kBf16Rne}};
  for (const StepCase& c : cases) {
    {
      SCOPED_TRACE(optimizer_name(c.kind));
      device::Runtime* rt = rt_.get();
      const uint64_t seed = 1;
      auto upload_stream = rt->create_stream("upload"), compute = rt->create_stream("compute");
      auto uploaded = rt->create_event(), stepped = rt->create_event();
      std::mt19937 rng(static_cast<uint32_t>(seed));
      std::normal_distribution<float> normal(0.0f, 1.0f);
      const size_t gsize = dtype_size(c.grad);
      struct Host {
        std::vector<float> master, s0, s1;
        std::vector<unsigned char> grad;
        std::vector<uint16_t> copy;
      };
      std::vector<Host> cpu(sizes.size()), dev_in(sizes.size());
      std::vector<KernelArgs> cpu_args, dev_args;
      std::vector<void*> device_buffers;
      auto device_copy_of = [&](const void* host, size_t bytes) {
        void* d = rt->allocate(bytes, *upload_stream);
        rt->copy(d, host, bytes, *upload_stream);
        device_buffers.push_back(d);
        return d;
      };
      for (size_t i = 0; i < sizes.size(); ++i) {
        const size_t n = sizes[i];
        Host& h = cpu[i];
        h.master.resize(n), h.s0.resize(n), h.s1.resize(n), h.grad.resize(n * gsize), h.copy.assign(n, 0);
        for (size_t j = 0; j < n; ++j) {
          h.master[j] = normal(rng), h.s0[j] = normal(rng) * 0.1f, h.s1[j] = std::abs(normal(rng)) * 0.01f;
          const float g = normal(rng);
          if (c.grad == DType::kF32) std::memcpy(&h.grad[j * 4], &g, 4);
          if (c.grad == DType::kBF16) {
            const uint16_t v = float_to_bf16_rne(g);
            std::memcpy(&h.grad[j * 2], &v, 2);
          }
          if (c.grad == DType::kF16) {
            const uint16_t v = float_to_fp16_rne(g);
            std::memcpy(&h.grad[j * 2], &v, 2);
          }
        }
        OptimizerHyper hyper;
        hyper.kind = c.kind;
        hyper.lr = 1e-3 * static_cast<double>(i + 1);
        hyper.momentum = 0.9;
        hyper.weight_decay = 0.01;
        KernelArgs a;
        a.n = n;
        a.grad_elem_size = gsize;
        a.first_index = i == 1 ? 0 : (i == 2 ? (uint64_t{1} << 32) - 1000 : 100000 * i);
        a.s = make_step_scalars(hyper, 3, 1.5, 1.0);
        a.s.seed = 0xabcdef01u + static_cast<uint32_t>(i);
        dev_args.push_back(a);
        a.master = h.master.data(), a.grad = h.grad.data(), a.state0 = h.s0.data();
        a.state1 = c.kind == OptimizerKind::kAdamW ? h.s1.data() : nullptr;
        a.copy = c.copy == CopyMode::kNone ? nullptr : h.copy.data();
        cpu_args.push_back(a);
        dev_in[i] = h;
      }
      for (size_t i = 0; i < sizes.size(); ++i) {
        KernelArgs& d = dev_args[i];
        if (d.n == 0) continue;
        const Host& h = dev_in[i];
        d.master = static_cast<float*>(device_copy_of(h.master.data(), d.n * 4));
        d.grad = device_copy_of(h.grad.data(), d.n * gsize);
        d.state0 = static_cast<float*>(device_copy_of(h.s0.data(), d.n * 4));
        d.state1 = cpu_args[i].state1 ? static_cast<float*>(device_copy_of(h.s1.data(), d.n * 4)) : nullptr;
        d.copy = cpu_args[i].copy ? device_copy_of(h.copy.data(), d.n * 2) : nullptr;
      }
      const cuda::LaunchTable table = cuda::plan_step_launches(c.kind, dev_args.data(), dev_args.size(), 1024);
      auto* segments = static_cast<KernelArgs*>(device_copy_of(dev_args.data(), dev_args.size() * sizeof(KernelArgs)));
      auto* chunks = static_cast<cuda::StepChunk*>(
          device_copy_of(table.chunks.data(), table.chunks.size() * sizeof(cuda::StepChunk)));
      rt->record(*uploaded, *upload_stream);
      rt->wait(*compute, *uploaded);
      rt->step(c.kind, c.grad, c.copy, table, dev_args.data(), dev_args.size(), segments, chunks, *compute);
      rt->record(*stepped, *compute);
      rt->wait(*upload_stream, *stepped);

      const KernelTable& k = kernels(Isa::kScalar);
      for (const KernelArgs& a : cpu_args)
        if (a.n > 0)
          parallel_step(k.step[static_cast<int>(c.kind)][static_cast<int>(c.grad)][static_cast<int>(c.copy)], a, 1);
      for (size_t i = 0; i < sizes.size(); ++i) {
        const KernelArgs& d = dev_args[i];
        if (d.n == 0) continue;
        EXPECT_EQ(cpu[i].master, download(*rt, *upload_stream, d.master, d.n)) << "segment " << i;
        EXPECT_EQ(cpu[i].s0, download(*rt, *upload_stream, d.state0, d.n)) << "segment " << i;
        if (d.state1) {
          EXPECT_EQ(cpu[i].s1, download(*rt, *upload_stream, d.state1, d.n)) << "segment " << i;
        }
        if (d.copy) {
          EXPECT_EQ(cpu[i].copy, download(*rt, *upload_stream, static_cast<const uint16_t*>(d.copy), d.n))
              << "segment " << i;
        }
      }
      for (void* p : device_buffers) rt->release(p, *upload_stream);
    }
  }
}

TEST_P(OnEachRuntime, NormAndConversionsGiveTheCpuBits) {
  device::Runtime* rt = rt_.get();
  auto s = rt->create_stream("s");
  const size_t n = 3 * kSumBlockElems + 777;
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::vector<float> f32(n);
  std::vector<uint16_t> bf16(n);
  for (size_t i = 0; i < n; ++i) f32[i] = normal(rng), bf16[i] = float_to_bf16_rne(normal(rng));
  const KernelTable& k = kernels(Isa::kScalar);
  std::vector<double> scratch(sum_squares_blocks(n));
  for (DType g : {DType::kF32, DType::kBF16}) {
    const void* host = g == DType::kF32 ? static_cast<const void*>(f32.data()) : bf16.data();
    const double want =
        parallel_sum_squares(k.sum_squares[static_cast<int>(g)], host, dtype_size(g), n, 2, scratch.data());
    void* d = rt->allocate(n * dtype_size(g), *s);
    rt->copy(d, host, n * dtype_size(g), *s);
    auto* work = static_cast<double*>(rt->allocate(cuda::sum_squares_scratch_doubles(n) * 8, *s));
    auto* result = static_cast<double*>(rt->allocate(8, *s));
    rt->sum_squares(g, d, n, work, result, *s);
    EXPECT_EQ(want, download(*rt, *s, result, 1)[0]) << dtype_name(g);
    for (void* p : {d, static_cast<void*>(work), static_cast<void*>(result)}) rt->release(p, *s);
  }
  // narrow -> widen -> accumulate, against the host kernels.
  float* df = upload(*rt, *s, f32);
  auto* dn = static_cast<uint16_t*>(rt->allocate(n * 2, *s));
  auto* dw = static_cast<float*>(rt->allocate(n * 4, *s));
  rt->narrow(DType::kF16, dn, df, n, *s);
  rt->widen(DType::kF16, dw, dn, n, *s);
  rt->accumulate(DType::kF16, df, dn, n, false, *s);
  std::vector<uint16_t> narrowed(n);
  std::vector<float> widened(n), summed = f32;
  k.narrow[static_cast<int>(DType::kF16)](narrowed.data(), f32.data(), n);
  k.widen[static_cast<int>(DType::kF16)](widened.data(), narrowed.data(), n);
  k.accumulate[static_cast<int>(DType::kF16)](summed.data(), narrowed.data(), n);
  EXPECT_EQ(narrowed, download(*rt, *s, dn, n));
  EXPECT_EQ(widened, download(*rt, *s, dw, n));
  EXPECT_EQ(summed, download(*rt, *s, df, n));
  for (void* p : {static_cast<void*>(df), static_cast<void*>(dn), static_cast<void*>(dw)}) rt->release(p, *s);
}

// Three streams take turns with two pooled buffers: each writes its value into the buffer it got and narrows it
// into its own output. Only the pool's last-use events order one stream's use after another's.
TEST_P(OnEachRuntime, PooledBuffersPassBetweenStreamsOrderedByTheirLastUse) {
  device::Runtime* rt = rt_.get();
  std::vector<std::unique_ptr<Stream>> streams;
  for (int k = 0; k < 3; ++k) streams.push_back(rt->create_stream("user " + std::to_string(k)));
  auto ready = rt->create_event();
  constexpr size_t n = 4096;
  std::vector<float*> values;
  std::vector<uint16_t*> outputs;
  for (int v = 0; v < 3; ++v) values.push_back(upload(*rt, *streams[0], std::vector<float>(n, 1.0f + v)));
  for (int k = 0; k < 3; ++k) outputs.push_back(static_cast<uint16_t*>(rt->allocate(n * 2, *streams[0])));
  rt->record(*ready, *streams[0]);
  for (auto& s : streams) rt->wait(*s, *ready);
  {
    device::StreamBufferPool pool(*rt, n * 4);
    pool.reserve(2, *streams[0]);
    std::vector<void*> held(3, nullptr);
    for (int i = 0; i < 60; ++i) {
      const int k = i % 3;
      if (held[k] == nullptr) held[k] = pool.acquire(*streams[k]);
      rt->copy(held[k], values[static_cast<size_t>(i % 3)], n * 4, *streams[k]);
      rt->narrow(DType::kBF16, outputs[static_cast<size_t>(k)], static_cast<float*>(held[k]), n, *streams[k]);
      pool.give_back(held[k], *streams[k]);
      held[k] = nullptr;
    }
    for (int k = 0; k < 3; ++k) {
      const std::vector<uint16_t> out =
          download(*rt, *streams[static_cast<size_t>(k)], outputs[static_cast<size_t>(k)], n);
      EXPECT_EQ(float_to_bf16_rne(1.0f + static_cast<float>(k)), out[n - 1]) << k;
    }
    pool.clear(*streams[0]);
  }
  for (int k = 0; k < 3; ++k) {
    rt->record(*ready, *streams[static_cast<size_t>(k)]);
    rt->wait(*streams[0], *ready);
  }
  for (float* p : values) rt->release(p, *streams[0]);
  for (uint16_t* p : outputs) rt->release(p, *streams[0]);
}

// ---- The emulator's own.

TEST(DeviceEmulatorDeathTest, TheHostCannotTouchDeviceMemory) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        auto rt = emulator();
        auto s = rt->create_stream("s");
        auto* d = static_cast<volatile float*>(rt->allocate(64, *s));
        d[3] = 1.0f;  // a host write through a device pointer
      },
      "");
}

TEST(DeviceEmulator, UsesOutsideLiveAllocationsAreErrors) {
  auto rt = emulator();
  auto s = rt->create_stream("s");
  std::vector<float> host(100);
  auto* d = static_cast<float*>(rt->allocate(100 * 4, *s));
  // The pool rounds the allocation up to 512 bytes; the 400 asked for are what may be used.
  EXPECT_NE(std::string::npos, what_of([&] { rt->copy(host.data(), d, 404, *s); }).find("4 bytes past the end"));
  rt->release(d, *s);
  EXPECT_NE(std::string::npos, what_of([&] { rt->copy(host.data(), d, 4, *s); }).find("not allocated"));
  EXPECT_NE(std::string::npos, what_of([&] { rt->release(d, *s); }).find("not a live device allocation"));
  // A kernel given host memory.
  EXPECT_NE(std::string::npos,
            what_of([&] { rt->widen(DType::kBF16, host.data(), host.data() + 60, 10, *s); }).find("not device memory"));
}

// Memory released on one stream and allocated on another: the new user's work runs after the release (the pool's
// ordering), and sees the poison the release left, never a half-written block.
TEST(DeviceEmulator, ReleasedMemoryIsReusedInStreamOrderAndPoisoned) {
  auto rt = emulator(7);
  auto a = rt->create_stream("a"), b = rt->create_stream("b");
  std::vector<uint32_t> ones(4096, 1u);
  for (int round = 0; round < 20; ++round) {
    uint32_t* p = upload(*rt, *a, ones);
    rt->fill_zero(p, 4096 * 4, *a);
    rt->release(p, *a);
    auto* q = static_cast<uint32_t*>(rt->allocate(4096 * 4, *b));
    ASSERT_EQ(p, q) << "the freed block was not reused";
    const std::vector<uint32_t> seen = download(*rt, *b, q, 4096);
    for (uint32_t v : seen) ASSERT_EQ(0xffffffffu, v);
    rt->release(q, *b);
  }
  EXPECT_TRUE(rt->races().empty());
}

// ---- The planted bugs. Each runs twice: with the event the checker is silent; without it, it names the race at
// the call that makes it, whatever the timing (delays of 0 .. 50 us may well hide the race itself).

TEST(DeviceEmulator, AMissingEventIsARace) {
  for (bool with_event : {true, false}) {
    auto rt = emulator(11);
    auto producer = rt->create_stream("producer"), consumer = rt->create_stream("consumer");
    auto written = rt->create_event();
    std::vector<float> x(512, 2.0f);
    auto* src = static_cast<float*>(rt->allocate_pinned(512 * 4));
    std::memcpy(src, x.data(), 512 * 4);
    auto* d = static_cast<float*>(rt->allocate(512 * 4, *producer));
    auto* out = static_cast<uint16_t*>(rt->allocate(512 * 2, *producer));
    rt->record(*written, *producer);
    rt->wait(*consumer, *written);  // the allocations are ordered before the consumer
    rt->copy(d, src, 512 * 4, *producer);
    if (with_event) {
      rt->record(*written, *producer);
      rt->wait(*consumer, *written);
    }
    const std::string what = what_of([&] { rt->narrow(DType::kBF16, out, d, 512, *consumer); });
    if (with_event) {
      EXPECT_EQ("", what);
      EXPECT_TRUE(rt->races().empty());
    } else {
      EXPECT_NE(std::string::npos, what.find("narrowing to bf16 on stream 'consumer' reads")) << what;
      EXPECT_NE(std::string::npos, what.find("a copy of 2048 bytes on stream 'producer' wrote")) << what;
      EXPECT_EQ(1u, rt->races().size());
    }
    rt->record(*written, *consumer);
    rt->wait(*producer, *written);
    rt->release(d, *producer);
    rt->release(out, *producer);
    rt->record(*written, *producer);
    rt->synchronize(*written, kTimeout, "the producer");  // its copy read the pinned source
    rt->release_pinned(src);
  }
}

// A pool hands a buffer to another stream: it must wait for the last use on the stream that gave it back.
TEST(DeviceEmulator, ABufferReusedBeforeItsLastUseIsARace) {
  for (bool with_last_use_event : {true, false}) {
    auto rt = emulator(13, /*throw_on_race=*/false);
    auto first = rt->create_stream("first user"), second = rt->create_stream("second user");
    auto last_use = rt->create_event();
    auto* buffer = static_cast<float*>(rt->allocate(4096 * 4, *first));
    auto* result = static_cast<uint16_t*>(rt->allocate(4096 * 2, *first));
    rt->fill_zero(buffer, 4096 * 4, *first);
    rt->narrow(DType::kF16, result, buffer, 4096, *first);  // the last use of `buffer` on the first stream
    rt->record(*last_use, *first);
    if (with_last_use_event) rt->wait(*second, *last_use);
    rt->fill_zero(buffer, 4096 * 4, *second);  // the second user writes it
    const std::vector<std::string> races = rt->races();
    if (with_last_use_event) {
      EXPECT_TRUE(races.empty());
    } else {
      ASSERT_EQ(1u, races.size());
      EXPECT_NE(std::string::npos, races[0].find("zeroing 16384 bytes on stream 'second user' writes")) << races[0];
      EXPECT_NE(std::string::npos, races[0].find("narrowing to fp16 on stream 'first user' read")) << races[0];
    }
    rt->record(*last_use, *second);
    rt->wait(*first, *last_use);
    rt->release(buffer, *first);
    rt->release(result, *first);
  }
}

TEST(DeviceEmulator, AHostReadOfPinnedMemoryBeforeTheCopyIsOrderedIsARace) {
  for (bool synchronize : {true, false}) {
    auto rt = emulator(17, /*throw_on_race=*/false);
    auto s = rt->create_stream("d2h");
    auto copied = rt->create_event();
    auto* d = static_cast<float*>(rt->allocate(256, *s));
    rt->fill_zero(d, 256, *s);
    auto* pinned = rt->allocate_pinned(256);
    rt->copy(pinned, d, 256, *s);
    rt->record(*copied, *s);
    if (synchronize) rt->synchronize(*copied, kTimeout, "the copy");
    rt->host_access(pinned, 256, false);
    EXPECT_EQ(synchronize ? 0u : 1u, rt->races().size());
    rt->synchronize(*copied, kTimeout, "the copy");
    rt->release(d, *s);
    rt->release_pinned(pinned);
  }
}

// A stale table: the launch table was planned from segments the device copy does not hold. The kernel fails on its
// stream; the error is sticky and the next host wait reports it.
TEST(DeviceEmulator, AKernelErrorIsStickyAndReportedAtTheNextWait) {
  auto rt = emulator();
  auto s = rt->create_stream("s");
  auto done = rt->create_event();
  std::vector<float> values(64, 1.0f);
  float* master = upload(*rt, *s, values);
  float* grad = upload(*rt, *s, values);
  KernelArgs a;
  a.master = master, a.grad = grad, a.n = 64;
  a.s.sgd = SgdScalars{};
  a.s.sgd.lr = 0.5f;
  KernelArgs stale = a;
  stale.n = 32;
  const cuda::LaunchTable table = cuda::plan_step_launches(OptimizerKind::kSgd, &a, 1, 16);
  auto* segments = upload(*rt, *s, std::vector<KernelArgs>{stale});
  auto* chunks = upload(*rt, *s, table.chunks);
  rt->step(OptimizerKind::kSgd, DType::kF32, CopyMode::kNone, table, &a, 1, segments, chunks, *s);
  rt->record(*done, *s);
  const std::string what = what_of([&] { rt->synchronize(*done, kTimeout, "the step"); });
  EXPECT_NE(std::string::npos, what.find("failed earlier")) << what;
  EXPECT_NE(std::string::npos, what.find("not the one its launch table was planned from")) << what;
  EXPECT_NE(std::string::npos, what_of([&] { rt->fill_zero(master, 4, *s); }).find("failed earlier"));
}

}  // namespace
}  // namespace zero
