// A TransferQueue (cpu_offload/transfer_queue.hpp) on a stream of the device runtime: ZeRO-Offload's copies between
// device memory and page-locked host memory run there, beside the engine's stream, so the bus and the device's
// compute overlap. The queue is ordered with the engine's stream by events only (the host waits for a copy only
// where it reads or rewrites host memory the copy uses): after_engine() makes the copies queued next wait for the
// engine's work so far (a reduction that wrote the gradients), engine_after() makes the engine's later work wait
// for a copy (a bucket reused, params used by the next forward).
#pragma once

#include <deque>
#include <memory>
#include <string>

#include "cpu_offload/offload_pipeline.hpp"
#include "cpu_offload/transfer_queue.hpp"
#include "device/device_memory.hpp"
#include "device/runtime.hpp"
#include "util/error.hpp"

namespace zero {
namespace device {

class DeviceTransferQueue final : public TransferQueue {
 public:
  // `engine`: the stream the engine's work is queued on. `name` names the queue's own stream; a copy not done
  // within `timeout_s` of a wait is ZERO_ERR_TIMEOUT naming it.
  DeviceTransferQueue(Runtime& runtime, Stream& engine, const std::string& name, double timeout_s);
  // Waits (within the timeout) for the copies queued, so that none writes memory its owner is about to free.
  ~DeviceTransferQueue() override;
  DeviceTransferQueue(const DeviceTransferQueue&) = delete;
  DeviceTransferQueue& operator=(const DeviceTransferQueue&) = delete;

  Ticket copy(void* dst, const void* src, size_t bytes, const std::string& what) override;
  bool done(Ticket t) override;
  void wait(Ticket t) override;
  void host_access(const void* p, size_t bytes, bool write) override { runtime_.host_access(p, bytes, write); }

  void after_engine() override;
  void engine_after(Ticket t) override;
  // A copy timed out or failed: later waits fail at once with that error (one stopped copy engine is not waited
  // for again and again), and whatever the copies touch must outlive the engine.
  bool failed() const { return !failure_.empty(); }
  Stream& stream() { return *stream_; }

 private:
  struct Copy {
    Ticket ticket;
    std::unique_ptr<Event> done;
    std::string what;
  };
  const Copy* find(Ticket t) const;  // null once it is known to be done
  void forget_done();

  Runtime& runtime_;
  Stream& engine_;
  std::unique_ptr<Stream> stream_;
  std::unique_ptr<Event> engine_point_;
  double timeout_s_;
  std::deque<Copy> copies_;  // in ticket order, the completed ones dropped from the front
  Ticket submitted_ = 0;
  std::string failure_;  // the first wait's error
  zero_status_t failure_status_ = ZERO_OK;
};

// ZeRO-Offload's transfers for a device engine: a queue each way beside the engine's stream, and the pipeline over
// the plan's staging slots that the gradient reducer and the stepper drive.
class OffloadTransfers {
 public:
  OffloadTransfers(std::shared_ptr<DeviceContext> context, const OffloadBuffers& buffers);
  OffloadPipeline& pipeline() { return pipeline_; }
  // A copy stopped or failed (DeviceTransferQueue::failed).
  bool failed() const { return to_host_.failed() || to_device_.failed(); }
  Stream& to_host_stream() { return to_host_.stream(); }

 private:
  std::shared_ptr<DeviceContext> context_;
  DeviceTransferQueue to_host_, to_device_;
  OffloadPipeline pipeline_;  // after the queues: gone (its copies waited for) before them
};

}  // namespace device
}  // namespace zero
