// The emulator's streams (device/emulator.hpp): a queue run in order by a worker thread, each operation after a
// random delay; how far it has run (Progress), which events and other streams' waits read; the events that mark
// points in it. Internal to the emulator.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <utility>

#include "device/access_checker.hpp"
#include "device/runtime.hpp"

namespace zero {
namespace device {
namespace emulation {

using Clock = std::chrono::steady_clock;

// How far one stream has run; events and other streams' waits read it, so it outlives the stream.
class Progress {
 public:
  void finish(uint64_t op) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      completed_ = op;
    }
    cv_.notify_all();
  }
  bool reached(uint64_t op) const {
    std::lock_guard<std::mutex> lock(mu_);
    return completed_ >= op;
  }
  void wait(uint64_t op) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return completed_ >= op; });
  }
  bool wait_until(uint64_t op, Clock::time_point deadline) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_until(lock, deadline, [&] { return completed_ >= op; });
  }

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  uint64_t completed_ = 0;
};

// Recorded by one thread while another waits for it, as CUDA's events may be: its point is read and written whole.
class EmulatedEvent final : public Event {
 public:
  struct Point {
    std::shared_ptr<Progress> progress;  // null until recorded
    uint64_t op = 0;
    VectorClock clock;
  };
  Point point() const {
    std::lock_guard<std::mutex> lock(mu_);
    return point_;
  }
  void set(Point p) {
    std::lock_guard<std::mutex> lock(mu_);
    point_ = std::move(p);
  }

 private:
  mutable std::mutex mu_;
  Point point_;
};

// A stream: its queue, run in order by one worker thread, each operation after a random delay.
class EmulatedStream final : public Stream {
 public:
  EmulatedStream(size_t actor, uint64_t seed, unsigned max_delay_us, std::function<void(const std::string&)> on_error,
                 std::shared_ptr<std::atomic<bool>> failed, std::shared_ptr<std::atomic<int>> live_streams)
      : live_streams_(std::move(live_streams)),
        actor_(actor),
        progress_(std::make_shared<Progress>()),
        rng_(seed),
        max_delay_us_(max_delay_us),
        on_error_(std::move(on_error)),
        failed_(std::move(failed)),
        worker_([this] { run(); }) {
    live_streams_->fetch_add(1);
  }
  // Unlike cudaStreamDestroy, which returns at once, the host waits here for the work queued so far.
  ~EmulatedStream() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    worker_.join();  // after the queue is empty: work queued before destruction finishes
    live_streams_->fetch_sub(1);
  }

  size_t actor() const { return actor_; }
  const std::shared_ptr<Progress>& progress() const { return progress_; }
  // Held by the host while it numbers an operation and queues it, so the queue stays in operation order.
  std::mutex& issue_mutex() { return issue_mu_; }

  void push(uint64_t op, std::function<void()> work) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.emplace_back(op, std::move(work));
    }
    cv_.notify_all();
  }

 private:
  void run() {
    for (;;) {
      std::pair<uint64_t, std::function<void()>> item;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
        if (queue_.empty()) return;
        item = std::move(queue_.front());
        queue_.pop_front();
      }
      if (max_delay_us_ > 0)
        std::this_thread::sleep_for(
            std::chrono::microseconds(std::uniform_int_distribution<unsigned>(0, max_delay_us_)(rng_)));
      // After a failure the device's work stops (CUDA's errors are sticky); waits still complete.
      if (!failed_->load()) {
        try {
          item.second();
        } catch (const std::exception& e) {
          on_error_(e.what());
        }
      }
      progress_->finish(item.first);
    }
  }

  std::shared_ptr<std::atomic<int>> live_streams_;  // the emulator's count
  const size_t actor_;
  std::shared_ptr<Progress> progress_;
  std::mt19937_64 rng_;
  const unsigned max_delay_us_;
  std::function<void(const std::string&)> on_error_;
  std::shared_ptr<std::atomic<bool>> failed_;
  std::mutex issue_mu_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::pair<uint64_t, std::function<void()>>> queue_;
  bool stopping_ = false;
  std::thread worker_;  // last: starts once everything above exists
};

// A stream of this emulator that its owner lent (Runtime::external_stream).
class LentStream final : public Stream {
 public:
  explicit LentStream(EmulatedStream& target) : target(target) {}
  EmulatedStream& target;
};

inline EmulatedStream& as_emulated(Stream& s) {
  if (auto* lent = dynamic_cast<LentStream*>(&s)) return lent->target;
  return static_cast<EmulatedStream&>(s);
}
inline const EmulatedEvent& as_emulated(const Event& e) { return static_cast<const EmulatedEvent&>(e); }

}  // namespace emulation
}  // namespace device
}  // namespace zero
