// The backend's collectives: started on MPI or queued for the node's window (or the hierarchy), waited for by
// polling (which also moves the window's queue), a reduce-scatter summed in rank order as it completes.
#include <mpi.h>
#include <sched.h>

#include <chrono>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "backend.hpp"
#include "comm/rank_order_sum.hpp"
#include "process_state.hpp"

namespace zero_mpi {

Op* Backend::start(const zero_collective_t& coll) {
  enter();
  InCall in(this);
  poll_control();
  auto op = std::make_unique<Op>();
  op->coll = coll;
  op->label = coll.label != nullptr ? coll.label : "";
  op->coll.label = op->label.c_str();
  // A collective a stopped rank will never join is not started (nothing is posted to MPI or queued on the
  // window, so no request outlives the caller's buffer), and fails when it is waited for. Not here: the engine
  // starts all-gathers ahead of their use, and a program's last zero_gather calls leave such prefetches started
  // and never waited for on every rank; the rank that finishes first must not fail the others' last gathers.
  op->refused = stopped_peer(coll.sequence, op->label.c_str());
  if (!op->refused.empty()) return op.release();
  const bool float_type =
      coll.dtype == ZERO_DTYPE_FP32 || coll.dtype == ZERO_DTYPE_BF16 || coll.dtype == ZERO_DTYPE_FP16;
  if ((window_ || hierarchy_) &&
      (coll.kind == ZERO_COLL_ALL_GATHER || (coll.kind == ZERO_COLL_REDUCE_SCATTER && float_type))) {
    // Moved chunk by chunk inside any later wait of this communicator, strictly in start order (the same on
    // every rank, whatever order the engine waits in: window_queue_).
    op->shm = true;
    op->hier = hierarchy_ != nullptr;
    if (op->hier)
      op->hier_op =
          hierarchy_->begin(coll.sequence, coll.kind, coll.dtype, coll.buf, coll.count, dtype_bytes(coll.dtype));
    else
      op->shm_op = window_->begin(coll.sequence, coll.kind, coll.dtype, coll.buf, coll.count, dtype_bytes(coll.dtype));
    if (use_progress_thread_) start_progress_thread();  // before queueing: it may fail
    in_flight_[coll.sequence] = InFlight{op->label, Clock::now(), op.get()};
    {
      std::lock_guard<std::mutex> lock(window_mutex_);
      window_queue_.push_back(op.get());
    }
    if (use_progress_thread_) window_cv_.notify_one();
    return op.release();
  }
  op->count = mpi_count(coll.count, coll.dtype);
  const Count& c = op->count;
  switch (coll.kind) {
    case ZERO_COLL_ALL_GATHER:
      check(MPI_Iallgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, coll.buf, c.n, c.type, data_, &op->request),
            "MPI_Iallgather");
      break;
    case ZERO_COLL_REDUCE_SCATTER:
      if (coll.dtype != ZERO_DTYPE_FP32 && coll.dtype != ZERO_DTYPE_BF16 && coll.dtype != ZERO_DTYPE_FP16)
        fail(ZERO_ERR_INVALID_ARGUMENT, "reduce-scatter of a non-float dtype");
      check(MPI_Ialltoall(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, coll.buf, c.n, c.type, data_, &op->request),
            "MPI_Ialltoall");
      break;
    case ZERO_COLL_ALL_REDUCE: {
      if (coll.dtype != ZERO_DTYPE_FP32 && coll.dtype != ZERO_DTYPE_FP64 && coll.dtype != ZERO_DTYPE_INT64)
        fail(ZERO_ERR_UNSUPPORTED, "the MPI backend all-reduces fp32, fp64 and int64 only");
      if (c.derived) fail(ZERO_ERR_UNSUPPORTED, "an all-reduce of more than 2^31 elements");
      const MPI_Op mop = coll.op == ZERO_REDUCE_MIN ? MPI_MIN : coll.op == ZERO_REDUCE_MAX ? MPI_MAX : MPI_SUM;
      check(MPI_Iallreduce(MPI_IN_PLACE, coll.buf, c.n, c.type, mop, data_, &op->request), "MPI_Iallreduce");
      break;
    }
    case ZERO_COLL_BROADCAST:
      if (coll.root < 0 || coll.root >= size_) fail(ZERO_ERR_INVALID_ARGUMENT, "broadcast root out of range");
      check(MPI_Ibcast(coll.buf, c.n, c.type, coll.root, data_, &op->request), "MPI_Ibcast");
      break;
    default:
      fail(ZERO_ERR_INVALID_ARGUMENT, "unknown collective kind " + std::to_string(coll.kind));
  }
  in_flight_[coll.sequence] = InFlight{op->label, Clock::now(), op.get()};
  return op.release();
}

bool Backend::wait(Op* op, double timeout_s) {
  enter();
  InCall in(this);
  if (!op->refused.empty()) {
    const std::string why = op->refused;
    abandoned_.emplace_back(op);
    fail(ZERO_ERR_REMOTE, why);
  }
  // What this rank answers when asked what it waits in (until the collective completes, also while it
  // diagnoses its own timeout): this collective, not the oldest in flight (a prefetch nobody waits for yet is
  // not what holds this rank).
  waiting_ = op;
  const auto begin = Clock::now();
  for (;;) {
    // Every wait moves the window's queue, whatever it waits for: a rank waiting for a later collective (or a
    // control message) still moves the chunks its peers wait for, so that ranks that wait in different orders
    // never wait for each other.
    progress_window(op);
    int done = 0;
    if (op->shm) {
      done = op->shm_done.load(std::memory_order_acquire) ? 1 : 0;
    } else if (MPI_Test(&op->request, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS) {
      abandon(op);  // kept, with its type and buffer, as a collective given up in flight
      fail(ZERO_ERR_COMM,
           "MPI_Test failed on collective #" + std::to_string(op->coll.sequence) + " (" + op->label + ")");
    }
    if (done) {
      complete(op);
      return true;
    }
    poll_control();
    if (g_exiting.load()) {  // exit() on another thread: leave MPI to the exit hook, which tells the others
      abandon(op);
      fail(ZERO_ERR_ABORTED, "this process is exiting (exit() was called on another thread while this call waited)");
    }
    if (abort_requested_.load()) {  // zero_engine_abort from another thread: tell the others from this one
      abandon(op);
      say_goodbye(abort_reason());
      fail(ZERO_ERR_ABORTED, "the communicator was aborted on this rank: " + abort_reason());
    }
    try {
      const std::string stopped = stopped_peer(op->coll.sequence, op->label.c_str());
      if (!stopped.empty()) fail(ZERO_ERR_REMOTE, stopped);
    } catch (const Failure&) {
      abandon(op);
      throw;
    }
    if (seconds_since(begin) >= timeout_s) {
#ifdef ZERO_TEST_HOOKS
      // The moment an abort from another thread can fall into: after the loop's last look, before the return.
      static const int late_return_us = [] {
        const char* env = std::getenv("ZERO_TEST_MPI_WAIT_LATE_RETURN_US");
        return env != nullptr ? std::atoi(env) : 0;
      }();
      if (late_return_us > 0) std::this_thread::sleep_for(std::chrono::microseconds(late_return_us));
#endif
      return false;
    }
    sched_yield();  // ranks may outnumber cores: let the others run
  }
}

// Advances the window's collectives in start order, as far as the peers allow (a bounded amount of work per
// call, so that the caller's wait loop keeps polling). A descriptor mismatch, found here or by the progress
// thread, fails the wait in progress. While the progress thread holds the queue the caller does not wait for it.
void Backend::progress_window(Op* waiting) {
  if (abort_requested_.load()) return;  // an aborted rank takes no further part
  std::unique_lock<std::mutex> lock(window_mutex_, std::try_to_lock);
  if (!lock.owns_lock()) return;
  if (window_failure_.empty()) step_window_locked(waiting);
  if (!window_failure_.empty()) {
    const std::string what = window_failure_;
    const zero_status_t status = window_failure_status_;
    window_queue_.clear();
    lock.unlock();
    // In one window every rank checks every descriptor, so every rank finds a mismatch at once. Across nodes, or
    // when a read failed, the ranks it touches see it: the others learn it from this rank's notice — sent before
    // the collectives are abandoned, so that it names the first this rank leaves unfinished.
    if (hierarchy_ || status != ZERO_ERR_MISMATCH) say_goodbye(what);
    abandon(waiting);
    fail(status, what);
  }
}

// With window_mutex_ held. Whether anything moved (a chunk, or a collective completed).
bool Backend::step_window_locked(const Op* stop_after) {
  bool moved = false;
  while (!window_queue_.empty()) {
    Op* front = window_queue_.front();
    if (front->hier) {
      using HP = zero_mpi::Hierarchy::Progress;
      const zero_mpi::Hierarchy::Op before = front->hier_op;
      const HP p = hierarchy_->step(front->hier_op);
      moved |= front->hier_op.chunk != before.chunk || front->hier_op.phase != before.phase ||
               front->hier_op.finals_done != before.finals_done || front->hier_op.exchanged != before.exchanged;
      if (p == HP::kMismatch || p == HP::kFailed) {
        window_failure_status_ = p == HP::kMismatch ? ZERO_ERR_MISMATCH : ZERO_ERR_COMM;
        window_failure_ = "collective #" + std::to_string(front->coll.sequence) + " (" + front->label +
                          "): " + (p == HP::kMismatch ? "the ranks are not in the same collective: " : "") +
                          hierarchy_->error();
        return moved;
      }
      if (p == HP::kWaiting) return moved;
    } else {
      const zero_mpi::NodeWindow::Op before = front->shm_op;
      const zero_mpi::NodeWindow::Progress p = window_->step(front->shm_op);
      moved |= front->shm_op.offset != before.offset || front->shm_op.copied != before.copied ||
               front->shm_op.phase != before.phase || front->shm_op.peer != before.peer;
      if (p == zero_mpi::NodeWindow::Progress::kMismatch) {
        window_failure_status_ = ZERO_ERR_MISMATCH;
        window_failure_ = "collective #" + std::to_string(front->coll.sequence) + " (" + front->label +
                          "): the ranks are not in the same collective: " + window_->mismatch();
        return moved;
      }
      if (p == zero_mpi::NodeWindow::Progress::kFailed) {
        window_failure_status_ = ZERO_ERR_COMM;
        window_failure_ =
            "collective #" + std::to_string(front->coll.sequence) + " (" + front->label + "): " + window_->failure();
        return moved;
      }
      if (p == zero_mpi::NodeWindow::Progress::kWaiting) return moved;
    }
    window_queue_.pop_front();
    front->shm_done.store(true, std::memory_order_release);
    moved = true;
    if (front == stop_after) return moved;
  }
  return moved;
}

void Backend::complete(Op* op) {
  std::unique_ptr<Op> owned(op);
  if (waiting_ == op) waiting_ = nullptr;
  if (op->coll.kind == ZERO_COLL_REDUCE_SCATTER && !op->shm)
    zero::sum_blocks_in_rank_order(op->coll.buf, op->coll.count, size_, rank_, op->coll.dtype);
  // The highest completed, not the last: collectives started together (a group, fetches ahead) may complete out
  // of order, and a notice must not say this rank left before one it took part in.
  if (op->coll.sequence >= completed_) {
    completed_ = op->coll.sequence;
    completed_label_ = op->label;
  }
  in_flight_.erase(op->coll.sequence);
}

// A collective given up while in flight: MPI cannot cancel it, so its request (and the caller's buffer) stay.
void Backend::abandon(Op* op) {
  in_flight_.clear();  // after a failure nothing more completes here (the engine stops using the communicator)
  {
    std::lock_guard<std::mutex> lock(window_mutex_);
    window_queue_.clear();
  }
  abandoned_.emplace_back(op);
}

}  // namespace zero_mpi
