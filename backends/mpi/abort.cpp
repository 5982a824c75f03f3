// Entering a call (its checks, the caller's thread), aborts requested from any thread, and which thread may call
// MPI when (the InCall guard of backend.hpp marks the thread inside a call).
#include <mpi.h>

#include <mutex>
#include <string>
#include <thread>

#include "backend.hpp"
#include "process_state.hpp"

namespace zero_mpi {

void Backend::abort(const std::string& reason) {
  {
    std::lock_guard<std::mutex> lock(abort_mutex_);
    if (abort_requested_.load()) return;
    abort_reason_ = reason;
    abort_requested_.store(true);
  }
  {
    std::lock_guard<std::mutex> lock(window_mutex_);  // the progress thread sees it before its next step
  }
  window_cv_.notify_one();
  // Tell the others now if this thread may call MPI and no call is running (its wait loop tells them); otherwise the
  // next call on the libzero thread does. Never waiting: an abort returns at once.
  std::unique_lock<std::recursive_timed_mutex> call(call_mutex_, std::try_to_lock);
  if (call.owns_lock() && !g_exiting.load() && may_call_mpi_now()) say_goodbye(reason);
}

std::string Backend::abort_reason() const {
  std::lock_guard<std::mutex> lock(abort_mutex_);
  return abort_reason_;
}

void Backend::enter() {
  if (g_exiting.load()) fail(ZERO_ERR_ABORTED, "this process is exiting (exit() was called): the communicator is gone");
  if (mpi_gone_) fail(ZERO_ERR_INVALID_STATE, "MPI has been finalized in this process; the communicator is gone");
  if (finalized_) fail(ZERO_ERR_INVALID_STATE, "the communicator was finalized (zero_comm_finalize)");
  if (g_provided == MPI_THREAD_FUNNELED) {
    int main_thread = 0;
    MPI_Is_thread_main(&main_thread);
    if (!main_thread)
      fail(ZERO_ERR_INVALID_STATE,
           "MPI was initialised with MPI_THREAD_FUNNELED, so only the thread that initialised it may call MPI, "
           "and this libzero call comes from another thread; initialise MPI with MPI_THREAD_SERIALIZED to call "
           "libzero from any one thread at a time");
  }
  caller_.store(std::this_thread::get_id());
  tell_pending_abort();
}

// The notice of an abort requested from another thread that could not send it (once: say_goodbye).
void Backend::tell_pending_abort() {
  if (abort_requested_.load() && !goodbye_sent_.load()) say_goodbye(abort_reason());
}

// After a call released the call lock: the notice of an abort that found the lock held, if no one sent it.
void Backend::tell_abort_left_to_us() {
  if (!abort_requested_.load() || goodbye_sent_.load()) return;
  std::unique_lock<std::recursive_timed_mutex> call(call_mutex_, std::try_to_lock);
  if (call.owns_lock() && !g_exiting.load() && may_call_mpi_now()) say_goodbye(abort_reason());
}

// Never while the thread inside libzero's calls is in one, whatever the thread level: its wait loop sees the
// abort and sends the notice itself, and the control state (peers, outbox) stays that thread's.
bool Backend::may_call_mpi_now() const {
  if (in_call_.load()) return false;
  if (g_provided == MPI_THREAD_MULTIPLE) return true;
  if (g_provided == MPI_THREAD_FUNNELED) {
    int main_thread = 0;
    MPI_Is_thread_main(&main_thread);
    return main_thread != 0;
  }
  const std::thread::id caller = caller_.load();
  return caller == std::this_thread::get_id() || caller == std::thread::id();
}

}  // namespace zero_mpi
