// The progress thread: moves the window's queue while the caller computes. It makes no MPI call and
// touches only the window and the buffers of collectives in flight (which the engine leaves alone until their
// wait). When peers are behind it backs off from spinning to short sleeps, so that an idle job costs no core.
// Lazily, with the first collective through the window; where the thread cannot be made (a container's thread
// limit), the waits move the queue, as without it.
#include <chrono>
#include <mutex>
#include <system_error>
#include <thread>

#include "backend.hpp"

namespace zero_mpi {

void Backend::start_progress_thread() {
  if (progress_thread_.joinable()) return;
  try {
    progress_thread_ = std::thread([this] { progress_loop(); });
  } catch (const std::system_error&) {
    use_progress_thread_ = false;
  }
}

void Backend::progress_loop() {
  int idle = 0;
  std::unique_lock<std::mutex> lock(window_mutex_);
  while (!stop_progress_) {
    // After an abort (zero_engine_abort, or this rank's own timeout) this rank takes no further part: what is
    // queued stays as it is, and the thread sleeps until it is stopped.
    if (window_queue_.empty() || !window_failure_.empty() || abort_requested_.load()) {
      idle = 0;
      window_cv_.wait(lock);
      continue;
    }
    const bool moved = step_window_locked(nullptr);
    if (moved) {
      idle = 0;
      continue;
    }
    ++idle;
    if (idle < 64) {
      lock.unlock();
      std::this_thread::yield();
      lock.lock();
    } else {  // a new collective wakes it at once
      window_cv_.wait_for(lock, std::chrono::microseconds(idle < 1024 ? 20 : 500));
    }
  }
}

// Before the window goes (zero_comm_finalize, MPI_Finalize, the backend's end).
void Backend::stop_progress_thread() {
  if (!progress_thread_.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(window_mutex_);
    stop_progress_ = true;
  }
  window_cv_.notify_one();
  progress_thread_.join();
}

}  // namespace zero_mpi
