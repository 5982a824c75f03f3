#include <chrono>
#include <deque>
#include <string>
#include <thread>
#include <vector>

#include "cuda/cuda_check.hpp"
#include "cuda/transfer_queue.hpp"

namespace zero {
namespace cuda {
namespace {

class StreamTransferQueue final : public TransferQueue {
 public:
  explicit StreamTransferQueue(double timeout_s) : timeout_s_(timeout_s) {
    check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
  }
  ~StreamTransferQueue() override {
    // The copies already queued finish first, within the timeout; a stream still busy after it (a device that
    // stopped) is left as it is, never destroyed under a running copy.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s_);
    while (cudaStreamQuery(stream_) == cudaErrorNotReady) {
      if (std::chrono::steady_clock::now() > deadline) return;
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
    cudaGetLastError();
    for (const InFlight& f : in_flight_) cudaEventDestroy(f.event);
    for (cudaEvent_t e : free_events_) cudaEventDestroy(e);
    cudaStreamDestroy(stream_);
  }

  Ticket copy(void* dst, const void* src, size_t bytes, const std::string& what) override {
    check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream_), ("cudaMemcpyAsync (" + what + ")").c_str());
    cudaEvent_t e = nullptr;
    if (free_events_.empty()) {
      check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreateWithFlags");
    } else {
      e = free_events_.back();
      free_events_.pop_back();
    }
    check(cudaEventRecord(e, stream_), "cudaEventRecord");
    in_flight_.push_back(InFlight{++submitted_, e, what});
    return submitted_;
  }

  bool done(Ticket t) override {
    if (t > submitted_) fail(ZERO_ERR_INTERNAL, "waited for a copy that was never queued");
    // Tickets complete in order on one stream: retire every completed event from the oldest on.
    while (!in_flight_.empty() && in_flight_.front().ticket <= t) {
      const cudaError_t err = cudaEventQuery(in_flight_.front().event);
      if (err == cudaErrorNotReady) return false;
      check(err, ("the copy of " + in_flight_.front().what).c_str());
      free_events_.push_back(in_flight_.front().event);
      in_flight_.pop_front();
    }
    return true;
  }

  void wait(Ticket t) override {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s_);
    for (int polls = 0; !done(t); ++polls) {
      if (std::chrono::steady_clock::now() > deadline)
        fail(ZERO_ERR_TIMEOUT, "copy " + std::to_string(in_flight_.front().ticket) + " (" + in_flight_.front().what +
                                   ") did not complete within " + exact_decimal(timeout_s_) +
                                   " s (libzero.timeout_s); the device may have stopped");
      // Spin briefly (a piece's copy takes tens of microseconds to milliseconds), then back off.
      if (polls < 1000) {
        std::this_thread::yield();
      } else {
        std::this_thread::sleep_for(std::chrono::microseconds(20));
      }
    }
  }

 private:
  struct InFlight {
    Ticket ticket;
    cudaEvent_t event;
    std::string what;
  };
  const double timeout_s_;
  cudaStream_t stream_ = nullptr;
  Ticket submitted_ = 0;
  std::deque<InFlight> in_flight_;
  std::vector<cudaEvent_t> free_events_;
};

}  // namespace

std::unique_ptr<TransferQueue> make_transfer_queue(double timeout_s) {
  return std::make_unique<StreamTransferQueue>(timeout_s);
}

}  // namespace cuda
}  // namespace zero
