// Asynchronous copies in submission order, each with a ticket that says when it has completed: what ZeRO-Offload
// moves gradients to the host and new params back with (cpu_offload/offload_pipeline.hpp). On a device engine it is
// a stream of the device runtime with an event per copy, run by the copy engines while the SMs compute
// (device/transfer_stream.hpp); HostTransferQueue keeps the same contract with a thread of its own over host
// memory, so that the pipeline's logic runs and is tested without a device runtime.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

namespace zero {

class TransferQueue {
 public:
  // 1, 2, 3, ... in submission order; a copy is done only when every copy before it is.
  using Ticket = uint64_t;
  virtual ~TransferQueue() = default;
  // Enqueues `bytes` bytes from src to dst and returns their ticket; both must stay valid until it is done.
  // `what` names the copy in errors ("the gradients of piece 3 to the host").
  virtual Ticket copy(void* dst, const void* src, size_t bytes, const std::string& what) = 0;
  // Whether ticket t has completed (throws the error of a failed copy at or before t).
  virtual bool done(Ticket t) = 0;
  // Until ticket t has completed: ZERO_ERR_TIMEOUT naming the oldest unfinished copy after the queue's timeout,
  // or the error of a copy that failed. No caller waits forever on a copy engine that stopped.
  virtual void wait(Ticket t) = 0;

  // The copies queued next read what the engine's work queued so far wrote (a device engine's stream: the queue's
  // stream waits for it). Nothing to do where the engine's work is the host's own, done when it was called.
  virtual void after_engine() {}
  // The engine's work queued from now on may overwrite what copy t reads or read what it writes (a device engine's
  // stream waits for it; the host waits where the engine's work is the host's).
  virtual void engine_after(Ticket t) { wait(t); }
  // The host is about to read (or write) [p, p + bytes) of memory the copies use, after a wait ordered it: a
  // device runtime's emulator checks that it was (cpu_offload's pipeline announces its slots).
  virtual void host_access(const void* p, size_t bytes, bool write) { (void)p, (void)bytes, (void)write; }
};

class HostTransferQueue final : public TransferQueue {
 public:
  // Called on the queue's thread before each copy with its ticket: tests delay, stall or fail copies with it
  // (a throw fails that copy and every wait for it or a later one). It must return: the destructor joins the
  // thread.
  using BeforeCopy = std::function<void(Ticket)>;
  explicit HostTransferQueue(double timeout_s, BeforeCopy before_copy = nullptr);
  // Finishes the copies already queued, then stops the thread.
  ~HostTransferQueue() override;
  HostTransferQueue(const HostTransferQueue&) = delete;
  HostTransferQueue& operator=(const HostTransferQueue&) = delete;

  Ticket copy(void* dst, const void* src, size_t bytes, const std::string& what) override;
  bool done(Ticket t) override;
  void wait(Ticket t) override;

 private:
  struct Job {
    void* dst;
    const void* src;
    size_t bytes;
    std::string what;
  };
  void run();
  void rethrow_failure_locked() const;

  const double timeout_s_;
  const BeforeCopy before_copy_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Job> jobs_;  // jobs_[i] has ticket completed_ + 1 + i
  Ticket submitted_ = 0, completed_ = 0;
  std::exception_ptr failure_;
  std::string failed_what_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace zero
