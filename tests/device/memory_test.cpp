// The engine's buffers on a device runtime (core/device/device_memory.hpp), on each runtime: buffers from the
// stream-ordered pool and pinned memory through Buffer and the allocators, zeroed and copied both ways through
// memory/ops.hpp, the element kernels on device memory with the CPU's bits (special values included; in place
// too), and clear errors for what the device does not do.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "comm/engine_comm.hpp"
#include "comm/single_communicator.hpp"
#include "device/device_memory.hpp"
#include "engine/host_staging.hpp"
#include "memory/buffer.hpp"
#include "memory/device_ops.hpp"
#include "memory/ops.hpp"
#include "numeric/dtype.hpp"
#include "runtimes.hpp"
#include "util/error.hpp"

namespace zero {
namespace {

constexpr MemorySpace kDev = MemorySpace::kDevice, kHost = MemorySpace::kHost;

class DeviceMemory : public testing_device::OnEachRuntime {
 protected:
  void SetUp() override {
    OnEachRuntime::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    context_ = std::make_shared<device::DeviceContext>(rt_, 60.0);
    device::install_device_memory(context_);
    device::install_allocators(allocators_, context_);
  }
  void TearDown() override {
    allocators_ = Allocators();
    device::install_device_memory(nullptr);
    context_.reset();
    OnEachRuntime::TearDown();
  }
  std::shared_ptr<Allocator> device_allocator() { return allocators_.get(kDev, "a test buffer"); }
  std::shared_ptr<device::DeviceContext> context_;
  Allocators allocators_;
};

INSTANTIATE_TEST_SUITE_P(Runtimes, DeviceMemory, testing_device::kEachRuntime, testing_device::runtime_name);

std::vector<float> values(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = normal(rng) * std::ldexp(1.0f, static_cast<int>(rng() % 40) - 20);
  const float specials[] = {0.0f,
                            -0.0f,
                            std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::quiet_NaN(),
                            std::numeric_limits<float>::denorm_min(),
                            1e-40f,
                            65504.0f,
                            65520.0f,
                            3.4e38f};
  for (size_t i = 0; i < sizeof(specials) / sizeof(specials[0]) && i < n; ++i) v[i * 7 % n] = specials[i];
  return v;
}

TEST_P(DeviceMemory, BuffersComeZeroedAlignedAndCopyBothWays) {
  for (size_t n : {size_t{1}, size_t{1000}, size_t{3} << 20}) {  // the last asks 2 MiB alignment
    Buffer d;
    d.allocate(kDev, n, DType::kF32, device_allocator());
    const size_t align = n * 4 >= (size_t{2} << 20) ? (size_t{2} << 20) : 64;
    EXPECT_EQ(reinterpret_cast<uintptr_t>(d.data()) % align, 0u);
    std::vector<float> back(n, 1.0f);
    copy_bytes(kHost, back.data(), kDev, d.data(), n * 4);
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(back[i], 0.0f) << "not zeroed at " << i;
    const std::vector<float> v = values(n, 3);
    copy_bytes(kDev, d.data(), kHost, v.data(), n * 4);
    Buffer d2;
    d2.allocate(kDev, n, DType::kF32, device_allocator());
    copy_bytes(kDev, d2.data(), kDev, d.data(), n * 4);
    copy_bytes(kHost, back.data(), kDev, d2.data(), n * 4);
    EXPECT_EQ(0, std::memcmp(back.data(), v.data(), n * 4));
  }
}

TEST_P(DeviceMemory, PinnedBuffersAreHostMemory) {
  Buffer p;
  p.allocate(MemorySpace::kPinnedHost, size_t{5} << 20, DType::kBF16,
             allocators_.get(MemorySpace::kPinnedHost, "a test buffer"));
  EXPECT_EQ(static_cast<const uint16_t*>(p.data())[12345], 0u);  // zeroed by the host: it can touch it
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p.data()) % (size_t{2} << 20), 0u);
  Buffer d;
  d.allocate(kDev, p.size(), DType::kBF16, device_allocator());
  static_cast<uint16_t*>(p.data())[77] = 0x3f80;
  copy_bytes(kDev, d.data(), MemorySpace::kPinnedHost, p.data(), p.n_bytes());
  std::vector<uint16_t> back(p.size());
  copy_bytes(kHost, back.data(), kDev, d.data(), p.n_bytes());
  EXPECT_EQ(back[77], 0x3f80);
}

TEST_P(DeviceMemory, ElementOpsOnTheDeviceHaveTheCpusBits) {
  const ElementOps& host = element_ops(kHost);
  const ElementOps& dev = element_ops(kDev);
  const size_t n = 100003;
  const std::vector<float> f = values(n, 7), acc0 = values(n, 8);
  std::vector<Buffer> held;
  auto on_device = [&](const void* src, size_t bytes) {
    held.emplace_back();
    held.back().allocate(kDev, bytes, DType::kU8, device_allocator());
    if (src != nullptr) copy_bytes(kDev, held.back().data(), kHost, src, bytes);
    return held.back().data();
  };
  held.reserve(16);
  auto back = [&](const void* p, size_t bytes) {
    std::vector<char> h(bytes);
    copy_bytes(kHost, h.data(), kDev, p, bytes);
    return h;
  };
  for (DType half : {DType::kBF16, DType::kF16}) {
    const std::string name = dtype_name(half);
    // fp32 -> 16-bit, rounded to nearest even (convert and round_from_f32).
    std::vector<char> want(n * 2);
    host.convert(want.data(), half, f.data(), DType::kF32, n);
    void* df = on_device(f.data(), n * 4);
    void* dh = on_device(nullptr, n * 2);
    dev.convert(dh, half, df, DType::kF32, n);
    EXPECT_EQ(back(dh, n * 2), want) << name << " narrow";
    dev.round_from_f32(dh, half, static_cast<const float*>(df), n);
    EXPECT_EQ(back(dh, n * 2), want) << name << " round_from_f32";
    // 16-bit -> fp32.
    std::vector<char> wide(n * 4);
    host.convert(wide.data(), DType::kF32, want.data(), half, n);
    void* dw = on_device(nullptr, n * 4);
    dev.convert(dw, DType::kF32, dh, half, n);
    EXPECT_EQ(back(dw, n * 4), wide) << name << " widen";
    // acc += src and acc = 0 + src into fp32.
    std::vector<float> acc = acc0;
    host.accumulate(acc.data(), DType::kF32, want.data(), half, n);
    void* da = on_device(acc0.data(), n * 4);
    dev.accumulate(da, DType::kF32, dh, half, n);
    std::vector<char> got = back(da, n * 4);
    EXPECT_EQ(0, std::memcmp(got.data(), acc.data(), n * 4)) << name << " accumulate";
    host.accumulate_into_zero(acc.data(), DType::kF32, want.data(), half, n);
    dev.accumulate_into_zero(da, DType::kF32, dh, half, n);
    got = back(da, n * 4);
    EXPECT_EQ(0, std::memcmp(got.data(), acc.data(), n * 4)) << name << " accumulate into zero";
  }
  // fp32 into fp32 (-0 + 0 is +0 into zero, as on the CPU).
  std::vector<float> acc = acc0;
  host.accumulate_into_zero(acc.data(), DType::kF32, f.data(), DType::kF32, n);
  void* df = on_device(f.data(), n * 4);
  void* da = on_device(acc0.data(), n * 4);
  dev.accumulate_into_zero(da, DType::kF32, df, DType::kF32, n);
  std::vector<char> got = back(da, n * 4);
  EXPECT_EQ(0, std::memcmp(got.data(), acc.data(), n * 4)) << "fp32 accumulate into zero";
}

// The reductions narrow a gradient buffer into the communication dtype in place (front to back on the CPU), and
// widen it back (back to front): on the device both go through a scratch buffer, with the same bits.
TEST_P(DeviceMemory, ConversionsInPlaceHaveTheCpusBits) {
  const size_t n = 70001;
  const std::vector<float> f = values(n, 11);
  for (DType half : {DType::kBF16, DType::kF16}) {
    std::vector<char> host(n * 4);
    std::memcpy(host.data(), f.data(), n * 4);
    element_ops(kHost).convert(host.data(), half, host.data(), DType::kF32, n);  // narrowed into the front half
    Buffer d;
    d.allocate(kDev, n, DType::kF32, device_allocator());
    copy_bytes(kDev, d.data(), kHost, f.data(), n * 4);
    element_ops(kDev).convert(d.data(), half, d.data(), DType::kF32, n);
    std::vector<char> got(n * 2);
    copy_bytes(kHost, got.data(), kDev, d.data(), n * 2);
    EXPECT_EQ(0, std::memcmp(got.data(), host.data(), n * 2)) << dtype_name(half) << " narrowed in place";
    element_ops(kHost).convert(host.data(), DType::kF32, host.data(), half, n);  // widened back in place
    element_ops(kDev).convert(d.data(), DType::kF32, d.data(), half, n);
    got.resize(n * 4);
    copy_bytes(kHost, got.data(), kDev, d.data(), n * 4);
    EXPECT_EQ(0, std::memcmp(got.data(), host.data(), n * 4)) << dtype_name(half) << " widened in place";
  }
}

TEST_P(DeviceMemory, WhatTheDeviceDoesNotDoIsAClearError) {
  Buffer b;
  b.allocate(kDev, 4096, DType::kU8, device_allocator());
  void* p = b.data();
  const ElementOps& dev = element_ops(kDev);
  try {
    dev.convert(p, DType::kBF16, p, DType::kF16, 512);
    FAIL() << "a conversion between two 16-bit dtypes on the device was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), ZERO_ERR_UNSUPPORTED);
  }
  EXPECT_THROW(dev.accumulate(p, DType::kBF16, static_cast<char*>(p) + 2048, DType::kBF16, 100), Error);
  EXPECT_THROW(copy_bytes(MemorySpace::kNvme, p, kDev, p, 16), Error);
  // Without the device's operations installed, device memory is ZERO_ERR_UNSUPPORTED, not a host memcpy.
  device::install_device_memory(nullptr);
  try {
    fill_zero(kDev, p, 16);
    FAIL() << "zeroing device memory without its operations was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), ZERO_ERR_UNSUPPORTED);
  }
  device::install_device_memory(context_);
}

// A device engine's data collectives take device memory only (what NCCL is given): the runtime tells device memory
// from pinned and pageable host memory, and a data collective on host memory is refused before it starts, on the
// host-staged path too, naming it.
TEST_P(DeviceMemory, DataCollectivesTakeDeviceMemoryOnly) {
  auto stream = rt_->create_stream("test");
  void* device = rt_->allocate(4096, *stream);
  void* pinned = rt_->allocate_pinned(4096);
  std::vector<float> pageable(1024, 1.0f);
  EXPECT_TRUE(rt_->device_memory(device, 4096));
  EXPECT_FALSE(rt_->device_memory(pinned, 4096));
  EXPECT_FALSE(rt_->device_memory(pageable.data(), 4096));
  {
    EngineComm comm(make_single_communicator());
    comm.set_data_in_device_memory(true);
    comm.set_data_staging(std::make_shared<device::PinnedStaging>(context_));
    comm.all_reduce_sum(device, 1024, ElemType::kF32, "a device buffer");
    try {
      comm.all_reduce_sum(pageable.data(), 1024, ElemType::kF32, "a host buffer");
      ADD_FAILURE() << "a data collective on host memory started";
    } catch (const Error& e) {
      EXPECT_EQ(ZERO_ERR_INTERNAL, e.status());
      EXPECT_NE(std::string::npos, std::string(e.what()).find("a host buffer")) << e.what();
      EXPECT_NE(std::string::npos, std::string(e.what()).find("not this engine's device memory")) << e.what();
    }
  }
  rt_->release_pinned(pinned);
  rt_->release(device, *stream);
  auto done = rt_->create_event();
  rt_->record(*done, *stream);
  rt_->synchronize(*done, testing_device::kTimeout, "the test's releases");
}

}  // namespace
}  // namespace zero
