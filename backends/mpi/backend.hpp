// The MPI backend behind zero.h's communicator callbacks (mpi_backend.cpp fills the table with it).
//
// Collectives are MPI's non-blocking ones, waited for by polling, so libzero's watchdog can give up on a
// collective that never completes. Reductions are deterministic: a reduce-scatter is an in-place all-to-all (the
// bytes a ring reduce-scatter sends) and a local sum in rank order 0..N-1 (MPI's own reductions pick their order
// by algorithm and message size).
//
// Beside the data communicator, a second duplicate carries small control messages, so that no rank waits without
// knowing why:
//  - NOTICE: "rank r stops after collective #k, because ..." — sent when this rank aborts (a timeout, a failure
//    after data moved, zero_engine_abort), destroys the communicator, calls MPI_Finalize (an attribute on
//    MPI_COMM_SELF runs first thing in MPI_Finalize) or exits (atexit). A rank waiting in a collective numbered
//    above k fails at once with ZERO_ERR_REMOTE naming r and its reason.
//  - QUERY / REPLY: after a timeout, the waiting rank asks every other rank what it is doing; ranks inside a
//    libzero collective answer (which collective, for how long), the silence of the others is itself the
//    diagnosis ("not inside libzero").
// Control messages are only sent and received from the thread that makes libzero's calls (MPI's thread levels
// below MPI_THREAD_MULTIPLE allow no other), inside the polling loop.
//
// The Backend's member functions are defined by concern: backend.cpp (setup, the path the collectives take, teardown),
// collectives.cpp (start, wait, the window's queue), progress_thread.cpp, control_channel.cpp (notices, queries,
// the diagnosis), abort.cpp (aborts from any thread, and which thread may call MPI).
#pragma once

#include <mpi.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <thread>
#include <vector>

#include "control_messages.hpp"
#include "datatypes.hpp"
#include "failure.hpp"
#include "hierarchy.hpp"
#include "node_window.hpp"
#include "zero/zero.h"

namespace zero_mpi {

using Clock = std::chrono::steady_clock;

inline double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// One collective in flight: an MPI request, or a collective through the node's shared window.
struct Op {
  zero_collective_t coll;
  std::string label;
  MPI_Request request = MPI_REQUEST_NULL;
  Count count;
  bool shm = false;                   // moved through window_queue_ (the node's window, or the hierarchy)
  bool hier = false;                  // by the hierarchy (several nodes), not by the one-node window
  std::atomic<bool> shm_done{false};  // the window moved every chunk (the op left window_queue_)
  std::string refused;                // not started: a rank stopped before it (the error its wait gives)
  zero_mpi::NodeWindow::Op shm_op;
  zero_mpi::Hierarchy::Op hier_op;
};

class Backend {
 public:
  Backend(MPI_Comm data, MPI_Comm ctl);

  int rank() const { return rank_; }
  int size() const { return size_; }
  int local_size() const { return local_size_; }
  const char* error() const { return error_.c_str(); }

  // One call from libzero, under the call lock (the exit hook takes it before it tears MPI down).
  template <typename Body>
  zero_status_t guarded(Body&& body) {
    zero_status_t status = ZERO_OK;
    {
      std::lock_guard<std::recursive_timed_mutex> call(call_mutex_);
      try {
        body();
      } catch (const Failure& f) {
        error_ = f.message;
        status = f.status;
      } catch (const std::bad_alloc&) {
        error_ = "out of memory in the MPI backend";
        status = ZERO_ERR_OUT_OF_MEMORY;
      } catch (const std::exception& e) {  // nothing may cross into libzero's C++ (std::thread's system_error)
        error_ = std::string("the MPI backend: ") + e.what();
        status = ZERO_ERR_INTERNAL;
      }
    }
    // An abort from another thread after this call last looked (InCall's end) and before the lock went: that thread
    // found the lock held and left the notice to this one.
    try {
      tell_abort_left_to_us();
    } catch (...) {  // the next call, the destroy or the exit hook sends it
    }
    return status;
  }

  // ---- Collectives (collectives.cpp)
  Op* start(const zero_collective_t& coll);
  bool wait(Op* op, double timeout_s);

  // ---- Failure handling (abort.cpp; the notices and the diagnosis: control_channel.cpp)
  void abort(const std::string& reason);
  std::string abort_reason() const;
  void say_goodbye(const std::string& occasion);
  std::string diagnose(uint64_t sequence, double grace_s);

  // ---- Teardown (backend.cpp)
  void finalize();
  // After finalize, outside the call lock: no longer live; the last of the ranks' communicators that libzero's MPI
  // served finalizes MPI.
  void leave_process();
  ~Backend();
  // Called first thing in MPI_Finalize, or by the exit hook (holding call_mutex()): the last chance to tell the others.
  void last_goodbye(const std::string& reason);
  // Held by every call from libzero (guarded) and by the exit hook while it tells the others and finalizes MPI;
  // recursive, since exit() may come from inside a call on the same thread (a callback).
  std::recursive_timed_mutex& call_mutex() { return call_mutex_; }

 private:
  // Marks the thread inside the backend, so that abort() from another thread knows not to call MPI.
  // Leaving, it sends the notice of an abort requested meanwhile by a thread that saw in_call_ and left it to this
  // one (the wait loop may have returned just before the request). in_call_ and abort_requested_ are sequentially
  // consistent, each thread writing its own and then reading the other's: if abort() saw in_call_ set, this
  // destructor sees its request. An abort() that saw in_call_ clear and may not call MPI (another thread below
  // MPI_THREAD_MULTIPLE) leaves the notice to this thread's next entry here, the destroy or the exit hooks (an
  // aborted engine's calls fail in the core, so in practice the last two), which send it with the abort's reason.
  struct InCall {
    explicit InCall(Backend* b) : b_(b) { b_->in_call_.store(true); }
    ~InCall() {
      b_->in_call_.store(false);
      try {
        b_->tell_pending_abort();
      } catch (...) {  // a destructor: the next call or the teardown sends it
      }
    }
    Backend* b_;
  };

  // abort.cpp
  void enter();
  void tell_pending_abort();
  void tell_abort_left_to_us();
  bool may_call_mpi_now() const;

  // control_channel.cpp
  std::string stopped_peer(uint64_t sequence, const char* label) const;
  uint64_t lowest_open() const;
  void post_inbox();
  void send(int to, const CtlMsg& m);
  void flush_sends(double timeout_s);
  bool complete_sends();
  void poll_control();
  void close_control(double timeout_s);

  // collectives.cpp
  void progress_window(Op* waiting);
  bool step_window_locked(const Op* stop_after);
  void complete(Op* op);
  void abandon(Op* op);

  // progress_thread.cpp
  void start_progress_thread();
  void progress_loop();
  void stop_progress_thread();

  struct Outgoing {
    CtlMsg msg;
    MPI_Request request = MPI_REQUEST_NULL;
  };

  MPI_Comm data_, ctl_;
  int rank_ = 0, size_ = 1, local_size_ = 1;
  std::string error_;
  std::vector<Peer> peers_;
  CtlMsg inbox_;
  MPI_Request inbox_request_ = MPI_REQUEST_NULL;
  std::list<Outgoing> outbox_;  // MPI_Isend keeps pointing at each message: a list never moves them
  std::mutex outbox_mutex_;
  uint64_t completed_ = 0;
  std::string completed_label_;
  uint64_t heard_ = 0;  // notices of stopped peers heard so far
  // Collectives started and not completed, by sequence (several when the engine starts a group).
  struct InFlight {
    std::string label;
    Clock::time_point since;
    const Op* op = nullptr;
  };
  std::map<uint64_t, InFlight> in_flight_;
  const Op* waiting_ = nullptr;  // the collective last waited for, until it completes
  // Every rank on one node: reduce-scatters and all-gathers go through this window (freed by finalize; a local
  // destroy leaves it to MPI_Finalize, as it does the communicators).
  std::unique_ptr<zero_mpi::NodeWindow> window_;
  // The window's collectives started and not moved through yet, in start order (the chunk protocol's order),
  // moved by waits and by the progress thread, under window_mutex_.
  std::deque<Op*> window_queue_;
  std::mutex window_mutex_;
  std::condition_variable window_cv_;
  // Several nodes of equal size, each holding consecutive ranks: reduce-scatters and all-gathers through each
  // node's window and between the nodes over MPI (hierarchy.hpp), on the node communicator node_.
  std::unique_ptr<zero_mpi::Hierarchy> hierarchy_;
  MPI_Comm node_ = MPI_COMM_NULL;
  std::string window_failure_;  // a descriptor mismatch or a failed message: every later wait fails with it
  zero_status_t window_failure_status_ = ZERO_ERR_MISMATCH;
  bool use_progress_thread_ = false;
  bool stop_progress_ = false;
  std::thread progress_thread_;
  std::vector<std::unique_ptr<Op>> abandoned_;
  std::atomic<bool> abort_requested_{false};
  mutable std::mutex abort_mutex_;
  std::string abort_reason_;
  std::atomic<bool> in_call_{false};
  std::atomic<std::thread::id> caller_{};  // read by abort() from other threads
  std::atomic<bool> goodbye_sent_{false};  // by whichever thread says it first
  bool control_closed_ = false, finalized_ = false, mpi_gone_ = false;
  std::recursive_timed_mutex call_mutex_;
};

}  // namespace zero_mpi
