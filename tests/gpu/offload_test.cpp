// ZeRO-Offload's pipeline on a GPU: the reduced gradients in device memory, the staging slots in page-locked host
// memory, CUDA streams as the transfer queues (cuda/transfer_queue.hpp), the new params back in device memory.
// The bits must equal the step without offload on the CPU (tests/unit/offload_model.hpp's reference), as they do
// with host buffers in tests/unit/offload_pipeline_test.cpp. Skipped, with the runtime's reason, without a device.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "cpu_offload/offload_pipeline.hpp"
#include "cuda/device_kernels.hpp"
#include "cuda/transfer_queue.hpp"
#include "device_buffer.hpp"
#include "offload_model.hpp"

namespace zero {
namespace {

using gpu_test::cuda_ok;
using gpu_test::DeviceBuffer;
using namespace offload_test;

class GpuOffload : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (!cuda::device_available(&why)) GTEST_SKIP() << "no CUDA device: " << why;
  }
};

class PinnedBuffer {
 public:
  explicit PinnedBuffer(size_t bytes) {
    if (bytes > 0) cuda_ok(cudaHostAlloc(&p_, bytes, cudaHostAllocPortable), "cudaHostAlloc");
  }
  ~PinnedBuffer() {
    if (p_ != nullptr) cudaFreeHost(p_);
  }
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  void* get() const { return p_; }

 private:
  void* p_ = nullptr;
};

TEST_F(GpuOffload, SameBitsAsTheStepWithoutOffload) {
  struct Case {
    DType transfer, grad, compute;
  };
  for (const Case c : {Case{DType::kBF16, DType::kF32, DType::kBF16}, Case{DType::kF32, DType::kF32, DType::kF16},
                       Case{DType::kF32, DType::kF32, DType::kF32}})
    for (int micro_steps : {1, 3}) {
      const std::string what = std::string(dtype_name(c.transfer)) + " over the bus, " + dtype_name(c.compute) +
                               " params, " + std::to_string(micro_steps) + " micro-steps";
      const int steps = 2;
      Model want = make_model(c.transfer, c.grad, c.compute, micro_steps, 21);
      reference(want, steps, micro_steps);
      Model got = make_model(c.transfer, c.grad, c.compute, micro_steps, 21);
      // The device side: each segment's bucket (its reduced gradients, rewritten every micro-step) and params.
      struct DeviceSegment {
        std::unique_ptr<DeviceBuffer<char>> bucket, params;
      };
      std::vector<std::vector<DeviceSegment>> device(got.pieces.size());
      size_t largest = 0;
      std::vector<OffloadPiece> pieces(got.pieces.size());
      for (size_t p = 0; p < got.pieces.size(); ++p) {
        size_t n = 0;
        for (SegmentData& s : got.pieces[p]) {
          DeviceSegment d;
          d.bucket = std::make_unique<DeviceBuffer<char>>(s.device_grads[0].size());
          d.params = std::make_unique<DeviceBuffer<char>>(s.device_params);
          OffloadSegment seg;
          seg.device_grad = d.bucket->get();
          seg.host_grad = s.host_grad.data();
          seg.device_params = d.params->get();
          seg.group = s.group;
          seg.args = host_args(s, c.grad);
          pieces[p].segments.push_back(seg);
          device[p].push_back(std::move(d));
          n += s.n;
        }
        largest = std::max(largest, n);
      }
      PinnedBuffer g0(largest * dtype_size(c.transfer)), g1(largest * dtype_size(c.transfer));
      const size_t param_bytes = c.compute == DType::kF32 ? 0 : largest * dtype_size(c.compute);
      PinnedBuffer p0(param_bytes), p1(param_bytes);
      OffloadBuffers buffers;
      buffers.grad_slots[0] = g0.get(), buffers.grad_slots[1] = g1.get();
      buffers.param_slots[0] = p0.get(), buffers.param_slots[1] = p1.get();
      buffers.grad_slot_bytes = largest * dtype_size(c.transfer);
      buffers.param_slot_bytes = param_bytes;
      auto to_host = cuda::make_transfer_queue(60.0), to_device = cuda::make_transfer_queue(60.0);
      {
        // One pipeline over every micro-step and step, as an engine keeps it.
        OffloadPipeline pipe(std::move(pieces), c.transfer, c.grad, c.compute, buffers, *to_host, *to_device);
        for (int step = 1; step <= steps; ++step)
          for (int k = 0; k < micro_steps; ++k) {
            for (size_t p = 0; p < got.pieces.size(); ++p)
              for (size_t i = 0; i < got.pieces[p].size(); ++i)
                device[p][i].bucket->upload(got.pieces[p][i].device_grads[static_cast<size_t>(k)]);
            // The "reduction" (an upload on the legacy stream) is complete before the copy stream reads it.
            cuda_ok(cudaDeviceSynchronize(), "the micro-step's gradients");
            pipe.begin_micro_step(k == 0);
            for (size_t p = pipe.pieces(); p-- > 0;) pipe.gradients_ready(p);  // backward order
            pipe.finish_gradients();
            if (k == micro_steps - 1) {
              for (size_t p = 0; p < pipe.pieces(); ++p) pipe.step(p, kernel_for(c.grad, c.compute), scalars(step), 1);
              pipe.finish_params();
            }
          }
      }
      for (size_t p = 0; p < got.pieces.size(); ++p)
        for (size_t i = 0; i < got.pieces[p].size(); ++i)
          got.pieces[p][i].device_params = device[p][i].params->download();
      expect_same(want, got, what);
    }
}

}  // namespace
}  // namespace zero
