#include "cpu_offload/transfer_queue.hpp"

#include <chrono>
#include <cstring>

#include "util/error.hpp"

namespace zero {

HostTransferQueue::HostTransferQueue(double timeout_s, BeforeCopy before_copy)
    : timeout_s_(timeout_s), before_copy_(std::move(before_copy)), thread_([this] { run(); }) {}

HostTransferQueue::~HostTransferQueue() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

TransferQueue::Ticket HostTransferQueue::copy(void* dst, const void* src, size_t bytes, const std::string& what) {
  std::lock_guard<std::mutex> lock(mu_);
  rethrow_failure_locked();
  jobs_.push_back(Job{dst, src, bytes, what});
  const Ticket t = ++submitted_;
  cv_.notify_all();
  return t;
}

bool HostTransferQueue::done(Ticket t) {
  std::lock_guard<std::mutex> lock(mu_);
  if (completed_ >= t) return true;  // even after a later copy failed, as a CUDA event would say
  rethrow_failure_locked();
  return false;
}

void HostTransferQueue::wait(Ticket t) {
  std::unique_lock<std::mutex> lock(mu_);
  if (t > submitted_) fail(ZERO_ERR_INTERNAL, "waited for a copy that was never queued");
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s_);
  while (completed_ < t && !failure_) {
    if (cv_.wait_until(lock, deadline) == std::cv_status::timeout && completed_ < t && !failure_) {
      fail(ZERO_ERR_TIMEOUT, "copy " + std::to_string(completed_ + 1) + " (" + jobs_.front().what +
                                 ") did not complete within " + exact_decimal(timeout_s_) +
                                 " s (libzero.timeout_s); the copy engine may have stopped");
    }
  }
  if (completed_ < t) rethrow_failure_locked();
}

void HostTransferQueue::rethrow_failure_locked() const {
  if (!failure_) return;
  try {
    std::rethrow_exception(failure_);
  } catch (const Error& e) {
    fail(e.status(), "copy failed (" + failed_what_ + "): " + e.what());
  } catch (const std::exception& e) {
    fail(ZERO_ERR_INTERNAL, "copy failed (" + failed_what_ + "): " + e.what());
  }
}

void HostTransferQueue::run() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stopping_ || !jobs_.empty(); });
    if (jobs_.empty()) return;  // stopping, nothing left
    if (failure_) {             // after a failure nothing more is copied; waits report it
      jobs_.clear();
      continue;
    }
    const Job job = jobs_.front();
    const Ticket t = completed_ + 1;
    lock.unlock();
    std::exception_ptr error;
    try {
      if (before_copy_) before_copy_(t);
      std::memcpy(job.dst, job.src, job.bytes);
    } catch (...) {
      error = std::current_exception();
    }
    lock.lock();
    jobs_.pop_front();
    if (error) {
      failure_ = error, failed_what_ = job.what;
    } else {
      completed_ = t;
    }
    cv_.notify_all();
  }
}

}  // namespace zero
