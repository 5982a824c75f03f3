// What the device runtime's tests share (tests/device): the runtimes each test runs on, and small helpers.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "device/cuda_module.hpp"
#include "device/emulator.hpp"
#include "device/runtime.hpp"
#include "util/error.hpp"

namespace zero {
namespace testing_device {

using device::Emulator;
using device::EmulatorOptions;
using device::Event;
using device::Stream;

constexpr double kTimeout = 60.0;

inline std::unique_ptr<Emulator> emulator(uint64_t seed = 1, bool throw_on_race = true) {
  EmulatorOptions o;
  o.seed = seed;
  o.max_delay_us = 50;
  o.arena_bytes = size_t{1} << 30;
  o.throw_on_race = throw_on_race;
  return device::make_emulator(o);
}

// Device memory holding `values`, uploaded on `stream` (from pageable memory: complete on return).
template <class T>
T* upload(device::Runtime& rt, Stream& stream, const std::vector<T>& values) {
  auto* p = static_cast<T*>(rt.allocate(values.size() * sizeof(T), stream));
  rt.copy(p, values.data(), values.size() * sizeof(T), stream);
  return p;
}

template <class T>
std::vector<T> download(device::Runtime& rt, Stream& stream, const T* p, size_t n) {
  std::vector<T> out(n);
  rt.copy(out.data(), p, n * sizeof(T), stream);
  return out;
}

inline std::string what_of(const std::function<void()>& body) {
  try {
    body();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// A test on each runtime: the emulator with two seeds of its delays, and CUDA (skipped with the runtime's reason
// where none opens, unless ZERO_TEST_REQUIRE_DEVICE is set). After each test on the emulator, no race was found and
// no device memory is left allocated.
class OnEachRuntime : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (GetParam() != "cuda") {
      rt_ = emulator(GetParam() == "emulator_seed1" ? 1 : 2);
      return;
    }
    try {
      rt_ = device::open_cuda_runtime();
    } catch (const Error& e) {
      // The GPU check sets it: there, a runtime that does not open is a failure, not a skip.
      if (std::getenv("ZERO_TEST_REQUIRE_DEVICE") != nullptr) FAIL() << e.what();
      GTEST_SKIP() << e.what();
    }
  }
  void TearDown() override {
    if (auto* e = dynamic_cast<Emulator*>(rt_.get())) {
      const std::vector<std::string> races = e->races();
      EXPECT_TRUE(races.empty()) << races.front();
      EXPECT_EQ(0u, e->live_device_bytes()) << "device memory left allocated";
    }
  }
  std::shared_ptr<device::Runtime> rt_;
};

inline const auto kEachRuntime = ::testing::Values("emulator_seed1", "emulator_seed2", "cuda");
inline std::string runtime_name(const ::testing::TestParamInfo<std::string>& info) { return info.param; }

}  // namespace testing_device
}  // namespace zero
