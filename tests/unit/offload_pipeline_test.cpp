// ZeRO-Offload's pipeline (core/cpu_offload/offload_pipeline.hpp) with host buffers standing where a GPU engine's
// device memory would be, and HostTransferQueue's thread as the copy engine: the bits equal the step without
// offload (gradients accumulated and stepped in place), for every order the pieces are made ready and stepped in,
// over several micro-steps and steps, with copies delayed at random (a slot reused too early would show as wrong
// bits), and a copy that stalls or fails is an error, never a hang. tests/device/offload_test.cpp runs the same
// pipeline with device memory and the device runtime's streams (the emulator's and CUDA's).
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "cpu_offload/offload_pipeline.hpp"
#include "cpu_offload/transfer_queue.hpp"
#include "offload_model.hpp"
#include "util/error.hpp"

namespace zero {
namespace {

using namespace offload_test;

enum class Order { kReadyThenStep, kStepAsReady, kBackwardOrder };

// Where a segment's new params go: to the "device" (through a param slot, or from the master with fp32), or
// straight into host memory (offload_param: args.copy is the params, no slot).
enum class Params { kOnDevice, kOnHost };

// One pipeline over every micro-step, as an engine keeps it: each segment's gradients arrive in one "device"
// buffer (its bucket) rewritten before each micro-step.
OffloadPipeline make_pipeline(Model& m, Staging& st, TransferQueue& to_host, TransferQueue& to_device,
                              Params params = Params::kOnDevice) {
  std::vector<OffloadPiece> pieces;
  for (auto& piece : m.pieces) {
    pieces.emplace_back();
    for (SegmentData& s : piece) {
      OffloadSegment seg;
      seg.device_grad = s.bucket.data();
      seg.host_grad = s.host_grad.data();
      seg.group = s.group;
      seg.args = host_args(s, m.grad);
      if (params == Params::kOnDevice) {
        seg.device_params = s.device_params.data();
      } else {
        seg.args.copy = s.device_params.data();
      }
      pieces.back().segments.push_back(seg);
    }
  }
  return OffloadPipeline(std::move(pieces), m.transfer, m.grad, m.compute, st.buffers, to_host, to_device);
}

// The reduction of micro-step k lands in the buckets (after the previous micro-step's copies are done).
void reduce_into_buckets(Model& m, int k) {
  for (auto& piece : m.pieces)
    for (SegmentData& s : piece) s.bucket = s.device_grads[static_cast<size_t>(k)];
}

// `steps` steps of `micro_steps` micro-steps through one pipeline.
void offloaded(Model& m, int steps, int micro_steps, Order order, TransferQueue& to_host, TransferQueue& to_device,
               Params params = Params::kOnDevice) {
  Staging st = staging_for(m);
  if (params == Params::kOnHost) st.buffers.param_slot_bytes = 0;  // no param is staged: the plan gives no slot
  OffloadPipeline pipe = make_pipeline(m, st, to_host, to_device, params);
  const size_t n = m.pieces.size();
  std::vector<size_t> ready(n);
  for (size_t p = 0; p < n; ++p) ready[p] = order == Order::kBackwardOrder ? n - 1 - p : p;
  for (int step = 1; step <= steps; ++step) {
    const auto per_group = scalars(step);
    for (int k = 0; k < micro_steps; ++k) {
      reduce_into_buckets(m, k);
      pipe.begin_micro_step(k == 0);
      const bool last = k == micro_steps - 1;
      for (size_t p : ready) {
        pipe.gradients_ready(p);
        // Stepping a piece as soon as it is ready (nothing needs the norm first) overlaps the CPU's work with the
        // next piece's transfer.
        if (last && order == Order::kStepAsReady) pipe.step(p, kernel_for(m.grad, m.compute), per_group, 1);
      }
      pipe.finish_gradients();  // the buckets may be rewritten now
      if (last && order != Order::kStepAsReady)
        for (size_t p = 0; p < n; ++p) pipe.step(p, kernel_for(m.grad, m.compute), per_group, 1);
      if (last) pipe.finish_params();
    }
  }
}

TEST(OffloadPipeline, SameBitsAsTheStepInPlaceInEveryOrder) {
  struct Case {
    DType transfer, grad, compute;
  };
  for (const Case c : {Case{DType::kF32, DType::kF32, DType::kBF16}, Case{DType::kBF16, DType::kF32, DType::kBF16},
                       Case{DType::kF16, DType::kF32, DType::kF16}, Case{DType::kF32, DType::kF32, DType::kF32}})
    for (int micro_steps : {1, 3})
      for (Order order : {Order::kReadyThenStep, Order::kStepAsReady, Order::kBackwardOrder}) {
        const std::string what = std::string(dtype_name(c.transfer)) + " over the bus, " + dtype_name(c.compute) +
                                 " params, " + std::to_string(micro_steps) + " micro-steps, order " +
                                 std::to_string(static_cast<int>(order));
        Model want = make_model(c.transfer, c.grad, c.compute, micro_steps, 7);
        Model got = make_model(c.transfer, c.grad, c.compute, micro_steps, 7);
        reference(want, 2, micro_steps);
        HostTransferQueue to_host(30.0), to_device(30.0);
        offloaded(got, 2, micro_steps, order, to_host, to_device);
        expect_same(want, got, what);
        // The params in host memory instead (offload_param): written by the step itself, no slot.
        Model on_host = make_model(c.transfer, c.grad, c.compute, micro_steps, 7);
        offloaded(on_host, 2, micro_steps, order, to_host, to_device, Params::kOnHost);
        expect_same(want, on_host, what + ", params in host memory");
      }
}

TEST(OffloadPipeline, CopiesDelayedAtRandomChangeNoBit) {
  // Each copy waits a random few hundred microseconds on the queue's thread: a slot written while the CPU still
  // reads it, or read before its copy completed, would change bits.
  auto jitter = [](uint32_t seed) {
    auto rng = std::make_shared<std::mt19937>(seed);
    return [rng](TransferQueue::Ticket) {
      std::this_thread::sleep_for(std::chrono::microseconds(std::uniform_int_distribution<int>(0, 400)(*rng)));
    };
  };
  for (Order order : {Order::kReadyThenStep, Order::kStepAsReady, Order::kBackwardOrder}) {
    Model want = make_model(DType::kBF16, DType::kF32, DType::kBF16, 2, 11);
    Model got = make_model(DType::kBF16, DType::kF32, DType::kBF16, 2, 11);
    reference(want, 3, 2);
    HostTransferQueue to_host(30.0, jitter(1)), to_device(30.0, jitter(2));
    offloaded(got, 3, 2, order, to_host, to_device);
    expect_same(want, got, "with delayed copies, order " + std::to_string(static_cast<int>(order)));
  }
}

TEST(OffloadPipeline, TwoPiecesCrossTheBusWhileTheCpuWaitsForNone) {
  // With both slots free, two pieces are made ready without waiting for any copy; the third must wait for the
  // first (its slot), and does once that copy may run.
  // The model and the staging outlive the queues, whose threads finish their copies before they stop.
  Model m = make_model(DType::kF32, DType::kF32, DType::kBF16, 1, 3);
  Staging st = staging_for(m);
  std::atomic<bool> release{false};
  HostTransferQueue to_host(30.0, [&](TransferQueue::Ticket) {
    while (!release.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  });
  HostTransferQueue to_device(30.0);
  reduce_into_buckets(m, 0);
  OffloadPipeline pipe = make_pipeline(m, st, to_host, to_device);
  pipe.begin_micro_step(true);
  pipe.gradients_ready(0);
  pipe.gradients_ready(1);  // returns: no copy has run yet
  std::atomic<bool> third_done{false};
  std::thread third([&] {
    pipe.gradients_ready(2);
    third_done = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_FALSE(third_done.load());  // piece 0's slot is still on its way
  release = true;
  third.join();
  EXPECT_TRUE(third_done.load());
  pipe.finish_gradients();
}

TEST(OffloadPipeline, AStalledCopyIsATimeoutNamingIt) {
  Model m = make_model(DType::kF32, DType::kF32, DType::kBF16, 1, 5);
  Staging st = staging_for(m);
  std::atomic<bool> release{false};
  HostTransferQueue to_host(0.2, [&](TransferQueue::Ticket t) {
    while (t == 2 && !release.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  });
  // However the test ends, the stalled copy is let go before the queue joins its thread.
  struct Release {
    std::atomic<bool>& flag;
    ~Release() { flag = true; }
  } guard{release};
  HostTransferQueue to_device(30.0);
  OffloadPipeline pipe = make_pipeline(m, st, to_host, to_device);
  pipe.begin_micro_step(true);
  pipe.gradients_ready(0);  // piece 0: copies 1 and 2 (two segments)
  pipe.gradients_ready(1);
  try {
    pipe.gradients_ready(2);  // waits for piece 0's slot
    FAIL() << "a stalled copy was waited for without a timeout";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), ZERO_ERR_TIMEOUT);
    EXPECT_NE(std::string(e.what()).find("the gradients of offload piece 0 to the host"), std::string::npos)
        << e.what();
  }
}

TEST(OffloadPipeline, AFailedCopyFailsTheStepWithItsStatus) {
  Model m = make_model(DType::kF32, DType::kF32, DType::kBF16, 1, 9);
  Staging st = staging_for(m);
  HostTransferQueue to_host(30.0);
  HostTransferQueue to_device(30.0, [](TransferQueue::Ticket t) {
    if (t == 3) fail(ZERO_ERR_INTERNAL, "cudaMemcpyAsync: an illegal memory access was encountered");
  });
  OffloadPipeline pipe = make_pipeline(m, st, to_host, to_device);
  pipe.begin_micro_step(true);
  for (size_t p = 0; p < pipe.pieces(); ++p) pipe.gradients_ready(p);
  pipe.finish_gradients();
  try {
    for (size_t p = 0; p < pipe.pieces(); ++p) pipe.step(p, kernel_for(DType::kF32, DType::kBF16), scalars(1), 1);
    pipe.finish_params();
    FAIL() << "a failed copy went unnoticed";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), ZERO_ERR_INTERNAL);
    EXPECT_NE(std::string(e.what()).find("illegal memory access"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("to the device"), std::string::npos) << e.what();
  }
}

TEST(HostTransferQueue, ACompletedCopyStaysDoneAfterALaterOneFails) {
  std::vector<char> a(64, 1), b(64, 0);
  HostTransferQueue q(30.0, [](TransferQueue::Ticket t) {
    if (t == 2) fail(ZERO_ERR_IO, "the second copy fails");
  });
  const TransferQueue::Ticket first = q.copy(b.data(), a.data(), 64, "first");
  q.wait(first);
  const TransferQueue::Ticket second = q.copy(b.data(), a.data(), 64, "second");
  EXPECT_THROW(q.wait(second), Error);
  EXPECT_TRUE(q.done(first));  // as a CUDA event of an earlier copy would say
  EXPECT_NO_THROW(q.wait(first));
  try {
    q.copy(b.data(), a.data(), 64, "third");
    FAIL() << "a queue that failed took another copy";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), ZERO_ERR_IO);
    EXPECT_NE(std::string(e.what()).find("second"), std::string::npos) << e.what();
  }
}

TEST(OffloadPipeline, MisuseIsAnInternalErrorNotCorruption) {
  Model m = make_model(DType::kF32, DType::kF32, DType::kBF16, 1, 13);
  Staging st = staging_for(m);
  HostTransferQueue to_host(30.0), to_device(30.0);
  {
    OffloadPipeline pipe = make_pipeline(m, st, to_host, to_device);
    pipe.begin_micro_step(true);
    EXPECT_THROW(pipe.step(0, kernel_for(DType::kF32, DType::kBF16), scalars(1), 1), Error);  // not ready
    pipe.gradients_ready(0);
    EXPECT_THROW(pipe.gradients_ready(0), Error);  // twice
    pipe.finish_gradients();
  }
  Staging small = staging_for(m);
  small.buffers.grad_slot_bytes = 16;
  EXPECT_THROW(make_pipeline(m, small, to_host, to_device), Error);  // a piece larger than its slot
}

}  // namespace
}  // namespace zero
