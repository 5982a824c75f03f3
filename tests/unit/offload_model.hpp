// A model for ZeRO-Offload's pipeline tests (tests/unit/offload_pipeline_test.cpp with host buffers,
// tests/device/offload_test.cpp with device memory): segments of odd sizes in two groups, grouped into pieces, with
// each micro-step's gradients as the device would hold them, and the step without offload to compare with.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cpu_offload/offload_pipeline.hpp"
#include "kernels/kernels.hpp"
#include "kernels/optimizer.hpp"
#include "memory/ops.hpp"
#include "numeric/convert.hpp"
#include "numeric/dtype.hpp"

namespace zero {
namespace offload_test {

// One segment's arrays: its "device" gradients per micro-step and params, and its host accumulator, master and
// state.
struct SegmentData {
  size_t n = 0;
  int group = 0;
  uint64_t first_index = 0;
  std::vector<std::vector<char>> device_grads;  // per micro-step, transfer dtype
  std::vector<char> bucket;                     // the device's reduced gradients of the current micro-step
  std::vector<char> device_params;              // compute dtype
  std::vector<char> host_grad;                  // grad dtype
  std::vector<float> master, state0, state1;
};

struct Model {
  DType transfer, grad, compute;
  std::vector<std::vector<SegmentData>> pieces;  // [piece][segment]
};

// Odd sizes, two groups interleaved, one piece with a single element and one larger than a norm block.
inline Model make_model(DType transfer, DType grad, DType compute, int micro_steps, uint32_t seed) {
  const std::vector<std::vector<size_t>> sizes = {{37, 5}, {1000}, {3, 129, 70001}, {1}, {17, 4096, 2}};
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  Model m{transfer, grad, compute, {}};
  uint64_t index = 0;
  int group = 0;
  for (const auto& piece : sizes) {
    m.pieces.emplace_back();
    for (size_t n : piece) {
      SegmentData s;
      s.n = n;
      s.group = group;
      group ^= 1;
      s.first_index = index;
      index += n;
      for (int k = 0; k < micro_steps; ++k) {
        std::vector<float> g(n);
        for (float& x : g) x = normal(rng) * 0.01f;
        s.device_grads.emplace_back(n * dtype_size(transfer));
        convert(s.device_grads.back().data(), transfer, g.data(), DType::kF32, n);
      }
      s.bucket.resize(n * dtype_size(transfer));
      s.master.resize(n);
      for (float& x : s.master) x = normal(rng);
      s.state0.assign(n, 0.0f);
      s.state1.assign(n, 0.0f);
      s.device_params.resize(n * dtype_size(compute));
      s.host_grad.assign(n * dtype_size(grad), 0);
      m.pieces.back().push_back(std::move(s));
    }
  }
  return m;
}

inline CopyMode copy_mode(DType compute) {
  return compute == DType::kBF16 ? CopyMode::kBf16Rne : compute == DType::kF16 ? CopyMode::kFp16Rne : CopyMode::kNone;
}

inline StepKernel kernel_for(DType grad, DType compute) {
  return kernels(active_isa())
      .step[static_cast<int>(OptimizerKind::kAdamW)][static_cast<int>(grad)][static_cast<int>(copy_mode(compute))];
}

inline std::vector<StepScalars> scalars(int64_t step) {
  std::vector<StepScalars> s;
  for (double lr : {1e-3, 3e-4}) {
    OptimizerHyper h;
    h.lr = lr;
    h.weight_decay = lr > 5e-4 ? 0.1 : 0.0;
    s.push_back(make_step_scalars(h, step, 6.0, 0.75));
  }
  return s;
}

inline KernelArgs host_args(SegmentData& s, DType grad) {
  KernelArgs a;
  a.master = s.master.data();
  a.grad_elem_size = dtype_size(grad);
  a.state0 = s.state0.data();
  a.state1 = s.state1.data();
  a.n = s.n;
  a.first_index = s.first_index;
  return a;
}

// The step without offload: every micro-step's gradients accumulated into the host gradients, then each
// segment stepped with its new params written straight into the device params.
inline void reference(Model& m, int steps, int micro_steps) {
  const ElementOps& ops = element_ops(MemorySpace::kHost);
  for (int step = 1; step <= steps; ++step) {
    for (int k = 0; k < micro_steps; ++k)
      for (auto& piece : m.pieces)
        for (SegmentData& s : piece)
          (k == 0 ? ops.accumulate_into_zero : ops.accumulate)(s.host_grad.data(), m.grad, s.device_grads[k].data(),
                                                               m.transfer, s.n);
    const auto per_group = scalars(step);
    for (auto& piece : m.pieces)
      for (SegmentData& s : piece) {
        KernelArgs a = host_args(s, m.grad);
        a.grad = s.host_grad.data();
        a.s = per_group[s.group];
        if (m.compute != DType::kF32) a.copy = s.device_params.data();
        parallel_step(kernel_for(m.grad, m.compute), a, 1);
        if (m.compute == DType::kF32) std::memcpy(s.device_params.data(), s.master.data(), s.n * 4);
      }
  }
}

struct Staging {
  std::vector<char> grad[2], param[2];
  OffloadBuffers buffers;
};

inline Staging staging_for(const Model& m) {
  size_t largest = 0;
  for (const auto& piece : m.pieces) {
    size_t n = 0;
    for (const SegmentData& s : piece) n += s.n;
    largest = std::max(largest, n);
  }
  Staging st;
  for (int i = 0; i < 2; ++i) {
    st.grad[i].resize(largest * dtype_size(m.transfer));
    st.param[i].resize(m.compute == DType::kF32 ? 0 : largest * dtype_size(m.compute));
    st.buffers.grad_slots[i] = st.grad[i].data();
    st.buffers.param_slots[i] = st.param[i].data();
  }
  st.buffers.grad_slot_bytes = st.grad[0].size();
  st.buffers.param_slot_bytes = st.param[0].size();
  return st;
}

inline void expect_same(const Model& want, const Model& got, const std::string& what) {
  for (size_t p = 0; p < want.pieces.size(); ++p)
    for (size_t i = 0; i < want.pieces[p].size(); ++i) {
      const SegmentData &w = want.pieces[p][i], &g = got.pieces[p][i];
      const std::string where = what + ", piece " + std::to_string(p) + " segment " + std::to_string(i);
      ASSERT_EQ(0, std::memcmp(w.master.data(), g.master.data(), w.n * 4)) << where << ": master";
      ASSERT_EQ(0, std::memcmp(w.state0.data(), g.state0.data(), w.n * 4)) << where << ": state0";
      ASSERT_EQ(0, std::memcmp(w.state1.data(), g.state1.data(), w.n * 4)) << where << ": state1";
      ASSERT_EQ(w.host_grad, g.host_grad) << where << ": gradients";
      ASSERT_EQ(w.device_params, g.device_params) << where << ": params";
    }
}

}  // namespace offload_test
}  // namespace zero
