// Device memory for the engine's buffers (cuda/device_memory.hpp): buffers from the device pool and pinned host
// memory through the engine's Buffer and allocators, copies and zeroing through memory/ops.hpp, the element kernels
// on device memory with the CPU's bits (special values included), the pool serving a freed buffer again without
// the driver, and clear errors for what the device does not do. Skipped, with the runtime's reason, without a device.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "cuda/device_kernels.hpp"
#include "cuda/device_memory.hpp"
#include "memory/buffer.hpp"
#include "memory/device_ops.hpp"
#include "memory/ops.hpp"
#include "numeric/dtype.hpp"
#include "util/error.hpp"

namespace zero {
namespace {

class GpuMemory : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (!cuda::device_available(&why)) GTEST_SKIP() << "no CUDA device: " << why;
    cuda::register_device_memory();
    cuda::install_allocators(allocators_);
  }
  Allocators allocators_;
};

constexpr MemorySpace kDev = MemorySpace::kDevice, kHost = MemorySpace::kHost;

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

TEST_F(GpuMemory, BuffersComeFromThePoolZeroedAndCopyBothWays) {
  for (size_t n : {size_t{1}, size_t{1000}, size_t{3} << 20}) {  // the last asks 2 MiB alignment
    Buffer d;
    d.allocate(kDev, n, DType::kF32, allocators_.get(kDev, "a test buffer"));
    const size_t align = n * 4 >= (size_t{2} << 20) ? (size_t{2} << 20) : 64;
    EXPECT_EQ(reinterpret_cast<uintptr_t>(d.data()) % align, 0u);
    cudaPointerAttributes attr{};
    ASSERT_EQ(cudaPointerGetAttributes(&attr, d.data()), cudaSuccess);
    EXPECT_EQ(attr.type, cudaMemoryTypeDevice);
    std::vector<float> back(n, 1.0f);
    copy_bytes(kHost, back.data(), kDev, d.data(), n * 4);
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(back[i], 0.0f) << "not zeroed at " << i;
    const std::vector<float> v = values(n, 3);
    copy_bytes(kDev, d.data(), kHost, v.data(), n * 4);
    Buffer d2;
    d2.allocate(kDev, n, DType::kF32, allocators_.get(kDev, "a test buffer"));
    copy_bytes(kDev, d2.data(), kDev, d.data(), n * 4);
    copy_bytes(kHost, back.data(), kDev, d2.data(), n * 4);
    EXPECT_EQ(0, std::memcmp(back.data(), v.data(), n * 4));
  }
}

TEST_F(GpuMemory, PinnedBuffersArePageLocked) {
  Buffer p;
  p.allocate(MemorySpace::kPinnedHost, size_t{5} << 20, DType::kBF16, allocators_.get(MemorySpace::kPinnedHost, "x"));
  cudaPointerAttributes attr{};
  ASSERT_EQ(cudaPointerGetAttributes(&attr, p.data()), cudaSuccess);
  EXPECT_EQ(attr.type, cudaMemoryTypeHost);  // registered: the copy engines reach it without staging
  EXPECT_EQ(static_cast<const uint16_t*>(p.data())[12345], 0u);
}

TEST_F(GpuMemory, AFreedBufferIsServedAgainFromThePool) {
  const size_t n = size_t{64} << 20;
  {
    Buffer warm;
    warm.allocate(kDev, n, DType::kF32, allocators_.get(kDev, "x"));
  }
  const uint64_t reserved = cuda::device_pool_reserved_bytes();
  for (int i = 0; i < 5; ++i) {
    Buffer b;
    b.allocate(kDev, n, DType::kF32, allocators_.get(kDev, "x"));
  }
  EXPECT_EQ(cuda::device_pool_reserved_bytes(), reserved) << "the pool went back to the driver";
}

TEST_F(GpuMemory, ElementOpsOnTheDeviceHaveTheCpusBits) {
  const ElementOps& host = element_ops(kHost);
  const ElementOps& dev = element_ops(kDev);
  const size_t n = 100003;
  const std::vector<float> f = values(n, 7), acc0 = values(n, 8);
  auto to_device = [&](const void* src, size_t bytes) {
    void* p = nullptr;
    EXPECT_EQ(cudaMalloc(&p, bytes), cudaSuccess);
    copy_bytes(kDev, p, kHost, src, bytes);
    return p;
  };
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
    void* df = to_device(f.data(), n * 4);
    void* dh = nullptr;
    ASSERT_EQ(cudaMalloc(&dh, n * 2), cudaSuccess);
    dev.convert(dh, half, df, DType::kF32, n);
    EXPECT_EQ(back(dh, n * 2), want) << name << " narrow";
    dev.round_from_f32(dh, half, static_cast<const float*>(df), n);
    EXPECT_EQ(back(dh, n * 2), want) << name << " round_from_f32";
    // 16-bit -> fp32.
    std::vector<char> wide(n * 4);
    host.convert(wide.data(), DType::kF32, want.data(), half, n);
    void* dw = nullptr;
    ASSERT_EQ(cudaMalloc(&dw, n * 4), cudaSuccess);
    dev.convert(dw, DType::kF32, dh, half, n);
    EXPECT_EQ(back(dw, n * 4), wide) << name << " widen";
    // acc += src and acc = 0 + src into fp32.
    std::vector<float> acc = acc0;
    host.accumulate(acc.data(), DType::kF32, want.data(), half, n);
    void* da = to_device(acc0.data(), n * 4);
    dev.accumulate(da, DType::kF32, dh, half, n);
    std::vector<char> got = back(da, n * 4);
    EXPECT_EQ(0, std::memcmp(got.data(), acc.data(), n * 4)) << name << " accumulate";
    host.accumulate_into_zero(acc.data(), DType::kF32, want.data(), half, n);
    dev.accumulate_into_zero(da, DType::kF32, dh, half, n);
    got = back(da, n * 4);
    EXPECT_EQ(0, std::memcmp(got.data(), acc.data(), n * 4)) << name << " accumulate into zero";
    cudaFree(df), cudaFree(dh), cudaFree(dw), cudaFree(da);
  }
  // fp32 into fp32 (-0 + 0 is +0 into zero, as on the CPU).
  std::vector<float> acc = acc0;
  host.accumulate_into_zero(acc.data(), DType::kF32, f.data(), DType::kF32, n);
  void* df = to_device(f.data(), n * 4);
  void* da = to_device(acc0.data(), n * 4);
  dev.accumulate_into_zero(da, DType::kF32, df, DType::kF32, n);
  std::vector<char> got = back(da, n * 4);
  EXPECT_EQ(0, std::memcmp(got.data(), acc.data(), n * 4)) << "fp32 accumulate into zero";
  cudaFree(df), cudaFree(da);
}

TEST_F(GpuMemory, WhatTheDeviceDoesNotDoIsAClearError) {
  void* p = nullptr;
  ASSERT_EQ(cudaMalloc(&p, 4096), cudaSuccess);
  const ElementOps& dev = element_ops(kDev);
  try {
    dev.convert(p, DType::kBF16, p, DType::kF32, 512);  // in place
    FAIL() << "an in-place conversion on the device was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), ZERO_ERR_UNSUPPORTED);
  }
  EXPECT_THROW(dev.accumulate(p, DType::kBF16, static_cast<char*>(p) + 2048, DType::kBF16, 100), Error);
  EXPECT_THROW(copy_bytes(MemorySpace::kNvme, p, kDev, p, 16), Error);
  cudaFree(p);
  // Without the device's operations registered, device memory is ZERO_ERR_UNSUPPORTED, not a host memcpy.
  set_device_memory_ops(nullptr);
  try {
    fill_zero(kDev, nullptr, 16);
    FAIL() << "zeroing device memory without its operations was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), ZERO_ERR_UNSUPPORTED);
  }
  cuda::register_device_memory();
}

}  // namespace
}  // namespace zero
