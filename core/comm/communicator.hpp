// The collectives the engine uses, behind one interface: start a collective (alone or in a group), wait for it
// with a timeout, abort; what a backend guarantees (CommCapabilities) and the queue a collective is ordered on.
// Backends: single process (comm/single_communicator.*), a custom table of callbacks (comm/custom_communicator.*,
// which is also how the MPI module in backends/mpi plugs in). Conventions are NCCL's and zero.h's
// (zero_collective_t): element counts as size_t, in-place buffers, a rank's block at buf + rank * count.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "comm/reduced_sink.hpp"
#include "memory/allocator.hpp"
#include "numeric/dtype.hpp"
#include "zero/zero.h"

namespace zero {

// Values are zero_dtype_t's, so a collective crosses the ABI without translation.
enum class ElemType {
  kF32 = ZERO_DTYPE_FP32,
  kBF16 = ZERO_DTYPE_BF16,
  kF16 = ZERO_DTYPE_FP16,
  kF64 = ZERO_DTYPE_FP64,
  kI64 = ZERO_DTYPE_INT64,
  kU8 = ZERO_DTYPE_UINT8
};
enum class ReduceOp { kSum = ZERO_REDUCE_SUM, kMin = ZERO_REDUCE_MIN, kMax = ZERO_REDUCE_MAX };
enum class CollKind {
  kAllGather = ZERO_COLL_ALL_GATHER,
  kReduceScatter = ZERO_COLL_REDUCE_SCATTER,
  kAllReduce = ZERO_COLL_ALL_REDUCE,
  kBroadcast = ZERO_COLL_BROADCAST
};

size_t elem_size(ElemType type);
ElemType elem_type(DType type);
const char* elem_type_name(ElemType type);
const char* coll_kind_name(CollKind kind);

struct Collective {
  CollKind kind = CollKind::kAllGather;
  ElemType type = ElemType::kF32;
  ReduceOp op = ReduceOp::kSum;
  int root = 0;
  void* buf = nullptr;
  size_t count = 0;       // per block (all-gather, reduce-scatter) or in all (all-reduce, broadcast)
  uint64_t sequence = 0;  // set by Communicator::start
  std::string label;      // what it is for, for diagnostics
  // The queue the collective is ordered on: a CUDA stream for a device backend (the engine's stream, so that it
  // runs after the kernels that produced its input), null for host backends and for the backend's own queue.
  void* queue = nullptr;
  // The buffer is host memory although the engine's data live on a device (rank 0's initial values): never staged.
  bool host_memory = false;
  // A reduce-scatter whose sum may be added in any order (libzero.deterministic: false): ZERO_COLL_ANY_ORDER.
  bool any_order = false;
  // A control message (the agreement, checks, the step's small sums): host memory, on Communicator::control_side.
  bool control = false;
  // A reduce-scatter of host memory: where a backend can, it hands this rank's summed block to the sink piece by
  // piece instead of storing it (comm/reduced_sink.hpp). Backends that cannot ignore it.
  ReducedSink* sink = nullptr;
};

// What a backend guarantees; the engine asks for what it needs (libzero.deterministic) and reports the rest
// (zero_engine_info).
struct CommCapabilities {
  bool deterministic_sums = false;  // float sums add contributions in rank order (ZERO_COMM_DETERMINISTIC)
  bool timeouts = false;            // a started collective can be waited for with a timeout (start/wait)
  bool device_buffers = false;      // buffers may live in device memory
};

// A collective in flight. Owned by whoever started it until wait() reports it done or failed.
using Request = void*;

class Communicator {
 public:
  virtual ~Communicator() = default;
  int rank() const { return rank_; }
  int size() const { return size_; }
  // Ranks of this communicator on this node (they share its cores).
  int local_size() const { return local_size_; }
  // Float sums add contributions in rank order (ZERO_COMM_DETERMINISTIC).
  bool deterministic() const { return deterministic_; }
  // Whether a started collective can be waited for with a timeout. Without it a collective blocks in start().
  virtual bool can_time_out() const { return false; }
  CommCapabilities capabilities() const {
    CommCapabilities c;
    c.deterministic_sums = deterministic_;
    c.timeouts = can_time_out();
    c.device_buffers = accepts_device_buffers();
    return c;
  }
  // A group of collectives started between group_begin and group_end may be fused by the backend (NCCL's
  // ncclGroupStart/End); each still completes through wait(). Host backends start each one as it comes.
  virtual void group_begin() {}
  virtual void group_end() {}

  // Numbers the collective (1, 2, ... per communicator: every rank issues collective n with the same arguments)
  // and starts it. Returns null if it already completed. Throws zero::Error.
  Request start(Collective& c);
  // Waits up to timeout_s for a started collective: true when it completed (the request is gone). Throws on
  // failure (the request is gone too).
  virtual bool wait(Request request, double timeout_s) = 0;
  // This rank stops taking part: pending and later collectives fail, and other ranks learn it. Any thread.
  // start() refuses from the moment an abort begins; aborted(), which the waits check between their slices, turns
  // true only once the backend has been told, so that a wait never gives up for the abort before the backend
  // knows (a wait inside the backend then fails there, and the backend tells the others with this reason).
  void abort(const std::string& reason);
  bool aborted() const { return aborted_.load(); }
  std::string abort_reason() const;
  // After a timeout: what the backend knows of the other ranks, for the error message, within about grace_s.
  virtual std::string diagnose(uint64_t /*sequence*/, double /*grace_s*/) { return ""; }
  // Host memory the collectives read in place on the peers' side (comm/shared_arena.hpp), for the buffers an
  // engine reduce-scatters: null where the backend has none (every backend but the shared-memory communicator on
  // one node with single copy). Buffers from it must be given back before the last reference to it goes.
  virtual std::shared_ptr<Allocator> shared_allocator() { return nullptr; }
  // Where an engine sends its control messages (agreement, checks: host memory, small) and its data collectives.
  // A split communicator (comm/split_communicator.hpp) has two backends; any other carries both itself.
  virtual Communicator& control_side() { return *this; }
  virtual Communicator& data_side() { return *this; }
  // Collective teardown (zero_comm_finalize); the caller has already agreed with every rank.
  void finalize();
  bool finalized() const { return finalized_; }
  uint64_t issued() const { return next_sequence_ - 1; }

 protected:
  Communicator(int rank, int size, int local_size, bool deterministic)
      : rank_(rank), size_(size), local_size_(local_size < 1 ? 1 : local_size), deterministic_(deterministic) {}
  virtual Request do_start(const Collective& c) = 0;
  virtual void do_abort(const std::string& /*reason*/) {}
  virtual void do_finalize() {}
  virtual bool accepts_device_buffers() const { return false; }

 private:
  int rank_, size_, local_size_;
  bool deterministic_;
  uint64_t next_sequence_ = 1;
  std::atomic<bool> aborted_{false};        // the backend has been told (do_abort returned or threw)
  std::atomic<bool> abort_started_{false};  // set under abort_mutex_, after abort_reason_: the first reason wins
  mutable std::mutex abort_mutex_;
  std::string abort_reason_;
  bool finalized_ = false;
};

}  // namespace zero
