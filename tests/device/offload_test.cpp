// ZeRO-Offload's pipeline over the device runtime: the reduced gradients in device memory written by the engine's
// stream, the staging slots in pinned memory, DeviceTransferQueue's streams (core/device/transfer_stream.hpp) as the
// bus, the new params back in device memory. On each runtime the bits must equal the step without offload on the
// CPU (tests/unit/offload_model.hpp's reference, as tests/unit/offload_pipeline_test.cpp does with host buffers);
// on the emulator the checker proves the ordering, and the negatives plant each missing dependency the pipeline
// supplies and see it named.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "cpu_offload/offload_pipeline.hpp"
#include "device/transfer_stream.hpp"
#include "offload_model.hpp"
#include "runtimes.hpp"

namespace zero {
namespace {

using namespace offload_test;
using testing_device::kTimeout;
using testing_device::OnEachRuntime;

class DeviceOffload : public OnEachRuntime {};

// The host waits for everything queued on `stream`.
void drain(device::Runtime& rt, device::Stream& stream) {
  std::unique_ptr<device::Event> e = rt.create_event();
  rt.record(*e, stream);
  rt.synchronize(*e, kTimeout, "the stream's work");
}

TEST_P(DeviceOffload, SameBitsAsTheStepWithoutOffload) {
  device::Runtime& rt = *rt_;
  struct Case {
    DType transfer, grad, compute;
  };
  for (const Case c : {Case{DType::kBF16, DType::kF32, DType::kBF16}, Case{DType::kF32, DType::kF32, DType::kF16},
                       Case{DType::kF32, DType::kF32, DType::kF32}})
    for (int micro_steps : {1, 3}) {
      const std::string what = std::string(dtype_name(c.transfer)) + " over the bus, " + dtype_name(c.compute) +
                               " params, " + std::to_string(micro_steps) + " micro-steps";
      SCOPED_TRACE(what);
      const int steps = 2;
      Model want = make_model(c.transfer, c.grad, c.compute, micro_steps, 21);
      reference(want, steps, micro_steps);
      Model got = make_model(c.transfer, c.grad, c.compute, micro_steps, 21);
      std::unique_ptr<device::Stream> engine = rt.create_stream("engine");
      // The device side: each segment's bucket (rewritten by the engine's stream every micro-step, from pinned
      // uploads) and params.
      std::vector<void*> device_memory;
      auto device_alloc = [&](size_t bytes) {
        device_memory.push_back(rt.allocate(bytes, *engine));
        return device_memory.back();
      };
      size_t largest = 0, upload_bytes = 0;
      std::vector<OffloadPiece> pieces(got.pieces.size());
      std::vector<std::vector<void*>> buckets(got.pieces.size()), params(got.pieces.size());
      for (size_t p = 0; p < got.pieces.size(); ++p) {
        size_t n = 0;
        for (SegmentData& s : got.pieces[p]) {
          OffloadSegment seg;
          seg.device_grad = device_alloc(s.bucket.size());
          seg.host_grad = s.host_grad.data();
          seg.device_params = device_alloc(s.device_params.size());
          seg.group = s.group;
          seg.args = host_args(s, c.grad);
          buckets[p].push_back(const_cast<void*>(seg.device_grad));
          params[p].push_back(seg.device_params);
          pieces[p].segments.push_back(seg);
          n += s.n;
          upload_bytes += s.bucket.size();
        }
        largest = std::max(largest, n);
      }
      const size_t grad_bytes = largest * dtype_size(c.transfer);
      const size_t param_bytes = c.compute == DType::kF32 ? 0 : largest * dtype_size(c.compute);
      OffloadBuffers buffers;
      std::vector<void*> pinned;
      for (int i = 0; i < 2; ++i) {
        pinned.push_back(buffers.grad_slots[i] = rt.allocate_pinned(grad_bytes));
        if (param_bytes > 0) pinned.push_back(buffers.param_slots[i] = rt.allocate_pinned(param_bytes));
      }
      buffers.grad_slot_bytes = grad_bytes;
      buffers.param_slot_bytes = param_bytes;
      char* uploads = static_cast<char*>(rt.allocate_pinned(upload_bytes));
      pinned.push_back(uploads);
      {
        device::DeviceTransferQueue to_host(rt, *engine, "to the host", kTimeout);
        device::DeviceTransferQueue to_device(rt, *engine, "to the device", kTimeout);
        // One pipeline over every micro-step and step, as an engine keeps it.
        OffloadPipeline pipe(std::move(pieces), c.transfer, c.grad, c.compute, buffers, to_host, to_device);
        for (int step = 1; step <= steps; ++step)
          for (int k = 0; k < micro_steps; ++k) {
            // The "reduction": the engine's stream writes every bucket (no host wait: the pipeline orders its
            // copies after it). The uploads' staging is rewritten once the engine's stream is done with it.
            drain(rt, *engine);
            rt.host_access(uploads, upload_bytes, true);
            size_t at = 0;
            for (size_t p = 0; p < got.pieces.size(); ++p)
              for (size_t i = 0; i < got.pieces[p].size(); ++i) {
                const std::vector<char>& g = got.pieces[p][i].device_grads[static_cast<size_t>(k)];
                std::memcpy(uploads + at, g.data(), g.size());
                rt.copy(buckets[p][i], uploads + at, g.size(), *engine);
                at += g.size();
              }
            pipe.begin_micro_step(k == 0);
            for (size_t p = pipe.pieces(); p-- > 0;) {
              const TransferQueue::Ticket t = pipe.gradients_ready(p);  // backward order
              pipe.reuse_after(t);  // the next micro-step's upload rewrites the bucket
            }
            pipe.finish_gradients();
            if (k == micro_steps - 1) {
              for (size_t p = 0; p < pipe.pieces(); ++p) pipe.step(p, kernel_for(c.grad, c.compute), scalars(step), 1);
              pipe.finish_params();
            }
          }
      }
      for (size_t p = 0; p < got.pieces.size(); ++p)
        for (size_t i = 0; i < got.pieces[p].size(); ++i) {
          SegmentData& s = got.pieces[p][i];
          s.device_params =
              testing_device::download(rt, *engine, static_cast<const char*>(params[p][i]), s.device_params.size());
        }
      for (void* p : device_memory) rt.release(p, *engine);
      drain(rt, *engine);
      for (void* p : pinned) rt.release_pinned(p);
      expect_same(want, got, what);
    }
}

// The negatives: each dependency the pipeline supplies, left out, is a race the emulator's checker names.
struct Planted {
  std::unique_ptr<device::Emulator> rt = testing_device::emulator(7, false);
  std::unique_ptr<device::Stream> engine = rt->create_stream("engine");
  void* bucket = rt->allocate(4096, *engine);
  void* params = rt->allocate(4096, *engine);
  void* slots[4] = {rt->allocate_pinned(4096), rt->allocate_pinned(4096), rt->allocate_pinned(4096),
                    rt->allocate_pinned(4096)};
  OffloadBuffers buffers() {
    OffloadBuffers b;
    b.grad_slots[0] = slots[0], b.grad_slots[1] = slots[1], b.param_slots[0] = slots[2], b.param_slots[1] = slots[3];
    b.grad_slot_bytes = b.param_slot_bytes = 4096;
    return b;
  }
  std::string races() {
    std::string all;
    for (const std::string& r : rt->races()) all += r + "\n";
    return all;
  }
  ~Planted() {
    rt->release(bucket, *engine);
    rt->release(params, *engine);
    drain(*rt, *engine);
    for (void* p : slots) rt->release_pinned(p);
  }
};

// The two queues and the pipeline over a Planted's slots.
struct Pipeline {
  explicit Pipeline(Planted& t)
      : to_host(*t.rt, *t.engine, "to the host", kTimeout),
        to_device(*t.rt, *t.engine, "to the device", kTimeout),
        pipe(t.buffers(), to_host, to_device) {}
  device::DeviceTransferQueue to_host, to_device;
  OffloadPipeline pipe;
};

TEST(DeviceEmulatorOffload, ACopyNotOrderedAfterTheReductionIsARace) {
  Planted t;
  {
    Pipeline offload(t);
    t.rt->fill_zero(t.bucket, 4096, *t.engine);  // the reduction writes the bucket
    offload.pipe.stage_gradients(t.bucket, 4096, nullptr, "staged");
    offload.pipe.finish_gradients();
    EXPECT_EQ("", t.races());
    t.rt->fill_zero(t.bucket, 4096, *t.engine);
    offload.to_host.wait(offload.to_host.copy(t.slots[0], t.bucket, 4096, "a copy without after_engine"));
  }
  EXPECT_NE(std::string::npos, t.races().find("on stream 'to the host' reads")) << t.races();
  EXPECT_NE(std::string::npos, t.races().find("with no event ordering")) << t.races();
}

TEST(DeviceEmulatorOffload, ABucketRewrittenBeforeItsCopyReadItIsARace) {
  Planted t;
  {
    Pipeline offload(t);
    offload.pipe.reuse_after(offload.pipe.stage_gradients(t.bucket, 4096, nullptr, "staged"));
    t.rt->fill_zero(t.bucket, 4096, *t.engine);  // the next micro-step, after the fence
    EXPECT_EQ("", t.races());
    offload.pipe.stage_gradients(t.bucket, 4096, nullptr, "staged again");
    t.rt->fill_zero(t.bucket, 4096, *t.engine);  // no fence
    offload.pipe.finish_gradients();
  }
  EXPECT_NE(std::string::npos, t.races().find("on stream 'engine' writes")) << t.races();
  EXPECT_NE(std::string::npos, t.races().find("with no event ordering")) << t.races();
}

TEST(DeviceEmulatorOffload, NewParamsOrderedBothWaysOrARace) {
  Planted t;
  {
    Pipeline offload(t);
    auto send = [&](char* slot, std::vector<OffloadPipeline::ToDevice>& copies) {
      std::memset(slot, 1, 4096);
      copies.push_back({t.params, slot, 4096});
    };
    // The engine's stream uses the old params; three sends follow it (the third reuses the first slot once its
    // copy is done); the engine uses the new params once they are there.
    t.rt->fill_zero(t.params, 4096, *t.engine);
    for (int i = 0; i < 3; ++i) offload.pipe.send_params(send, "params");
    offload.pipe.finish_params();
    t.rt->fill_zero(t.params, 4096, *t.engine);
    EXPECT_EQ("", t.races());
    // New params copied while the engine's stream may still use the old ones.
    t.rt->fill_zero(t.params, 4096, *t.engine);
    offload.to_device.wait(offload.to_device.copy(t.params, t.slots[2], 4096, "a copy without after_engine"));
    EXPECT_NE(std::string::npos, t.races().find("on stream 'to the device' writes")) << t.races();
    // The engine's stream uses the params before their copy is done.
    size_t before = t.rt->races().size();
    offload.pipe.send_params(send, "params");
    t.rt->fill_zero(t.params, 4096, *t.engine);
    offload.pipe.finish_params();
    EXPECT_GT(t.rt->races().size(), before);
    EXPECT_NE(std::string::npos, t.races().find("on stream 'engine' writes")) << t.races();
    // The host rewrites a slot whose copy it has not waited for.
    before = t.rt->races().size();
    offload.to_device.after_engine();
    offload.to_device.copy(t.params, t.slots[2], 4096, "a copy from the slot");
    offload.to_host.host_access(t.slots[2], 4096, true);
    EXPECT_GT(t.rt->races().size(), before) << t.races();
  }
}

INSTANTIATE_TEST_SUITE_P(Runtimes, DeviceOffload, testing_device::kEachRuntime, testing_device::runtime_name);

}  // namespace
}  // namespace zero
