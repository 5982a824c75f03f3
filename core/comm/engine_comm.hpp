// An engine's view of its communicator, and the one path every collective of the engine takes (engine_comm.cpp;
// the agreement is agreement.cpp, the recorder flight_recorder.hpp):
//  - counting: calls, payload bytes and wire bytes per kind (the ZeRO traffic formulas), control messages apart;
//  - the watchdog: every collective is started and then waited for with the engine's timeout; on expiry the
//    backend is asked what it knows of the other ranks, the communicator is aborted (so the others learn it) and
//    the call fails with ZERO_ERR_TIMEOUT naming the collective and the missing ranks;
//  - the agreement (agree()): before a collective call moves data, every rank contributes its local status and a
//    tag saying which collective it is about to run; a failure anywhere becomes an error on every rank
//    (ZERO_ERR_REMOTE on the others, naming the rank and its message), and ranks that are about to run different
//    collectives all get ZERO_ERR_MISMATCH naming what each one called — never mixed data or a hang;
//  - a flight recorder of the last collectives, readable from any thread.
// Counting here rather than in a backend keeps the statistics per engine and identical for every backend.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "comm/communicator.hpp"
#include "comm/data_staging.hpp"
#include "comm/flight_recorder.hpp"
#include "util/error.hpp"

namespace zero {

struct CommKindStats {
  uint64_t calls = 0;
  uint64_t bytes = 0;       // payload, as nccl-tests counts "size"
  uint64_t wire_bytes = 0;  // sent by one rank in a bandwidth-optimal algorithm
};

struct CommStats {
  uint64_t sequence = 0;  // every collective this engine issued, control included
  CommKindStats all_gather, reduce_scatter, all_reduce, broadcast;
  CommKindStats control;  // agreement and checks; not in the four kinds above
};

// Which collective call a rank is about to make, as the agreement compares it.
enum class CallKind : int64_t {
  kFinalize = 1,
  kGather = 2,
  kReduceBucket = 3,
  kBackwardEnd = 4,
  kStep = 5,
  kSaveCheckpoint = 6,
  kLoadCheckpoint = 7,
  kCommFinalize = 8,
  kPrefetch = 9,
  kReleaseModified = 10,
  kCommCreate = 11,
};

struct CallTag {
  CallKind kind = CallKind::kFinalize;
  int64_t id = -1;    // unit, bucket, micro-step or step number (kind-specific)
  int64_t count = 0;  // elements the call moves
  int64_t check = 0;  // a digest of other inputs that must agree (zero_step: the learning rates)
  // What the model-parallel group compares instead of `check` where its parts' inputs differ by design (a load's
  // manifests: one per part, of one save).
  int64_t shared_check = 0;
};

std::string describe_call(const CallTag& tag);

// zero_comm_finalize: every rank agrees that the communicator is done (a rank that does not arrive is reported,
// not waited for forever), then the backend frees its collective resources.
void finalize_communicator(const std::shared_ptr<Communicator>& comm);

class EngineComm {
 public:
  explicit EngineComm(std::shared_ptr<Communicator> comm);
  EngineComm(const EngineComm&) = delete;
  EngineComm& operator=(const EngineComm&) = delete;

  int rank() const { return comm_->rank(); }
  int size() const { return comm_->size(); }
  int local_size() const { return comm_->local_size(); }
  bool deterministic() const { return comm_->deterministic(); }
  Communicator& backend() { return *comm_; }
  const Communicator& backend() const { return *comm_; }
  void set_timeout(double seconds) { timeout_s_ = seconds; }
  // A device engine's: the data collectives' buffers are device memory, which a host backend must not touch. At one
  // rank they are identities (the in-place convention), so they move nothing; the control exchanges run as ever.
  void set_data_in_device_memory(bool on) { data_in_device_memory_ = on; }
  // At more than one rank, a backend that does not accept device buffers runs a device engine's data collectives
  // through `staging` (comm/data_staging.hpp): the host-staged path.
  void set_data_staging(std::shared_ptr<DataStaging> staging) { staging_ = std::move(staging); }
  // Whether this engine's data collectives go through host staging.
  bool host_staged() const {
    return data_in_device_memory_ && staging_ != nullptr && size() > 1 && !comm_->capabilities().device_buffers;
  }
  // A device engine's stream (its native handle): where the data collectives' inputs were produced and their results
  // are used, handed to a backend that takes device buffers (zero_collective_t.stream).
  void set_data_queue(void* stream) { data_queue_ = stream; }
  // libzero.deterministic: false: reduce-scatters may sum in any order (ZERO_COLL_ANY_ORDER).
  void set_any_order(bool on) { any_order_ = on; }
  // What the agreement's messages call a rank of this group ("rank", "model-parallel rank").
  void set_rank_name(std::string name) { rank_name_ = std::move(name); }
  const std::string& rank_name() const { return rank_name_; }
  double timeout() const { return timeout_s_; }

  // ---- Non-blocking data collectives. start_* issues a collective (every rank in the same order) and returns at
  // once; wait() completes it under the watchdog (the timeout counts from its start). A Pending must be waited
  // for, in start order, before its buffer is touched. A group is started back to back with the backend told so
  // (NCCL fuses a group into one launch); wait_all() completes it.
  class Pending {
   public:
    Pending() = default;
    Pending(Pending&& o) noexcept { *this = std::move(o); }
    Pending& operator=(Pending&& o) noexcept {
      std::swap(owner_, o.owner_), std::swap(c_, o.c_), std::swap(request_, o.request_), std::swap(slot_, o.slot_);
      std::swap(begin_, o.begin_), std::swap(active_, o.active_), std::swap(staged_, o.staged_),
          std::swap(via_, o.via_);
      return *this;
    }
    // Dropped without wait() (an exception between start and wait): the collective may still run in the backend
    // and write its buffer, and this rank's sequence is apart from the others'.
    ~Pending() {
      if (active_ && owner_ != nullptr) {
        owner_->failed_ = true;
        // A staged collective's backend writes the host copy only, which the staging keeps; else the caller's buffer.
        if (staged_.host == nullptr) owner_->abandoned_ = true;
      }
    }
    bool active() const { return active_; }

   private:
    friend class EngineComm;
    EngineComm* owner_ = nullptr;
    Collective c_;
    Request request_ = nullptr;
    Communicator* via_ = nullptr;  // the side it runs on (Communicator::control_side or data_side)
    size_t slot_ = 0;
    std::chrono::steady_clock::time_point begin_;
    bool active_ = false;
    // Host-staged: the device buffer the result goes back to, the host copy the backend works on, and the range
    // of the result (bytes from the start of both).
    struct Staged {
      void* device = nullptr;
      char* host = nullptr;
      size_t result_offset = 0, result_bytes = 0;
    } staged_;
  };
  Pending start_all_gather(void* buf, size_t block, ElemType type, const std::string& label);
  Pending start_reduce_scatter_sum(void* buf, size_t block, ElemType type, const std::string& label);
  void wait(Pending& pending);
  // Waits up to `seconds` without the watchdog's consequences (no abort, no diagnosis): whether it completed. For
  // an engine going away that would rather finish what it started than leave it to the backend. Not completed
  // (time, or a backend error): the caller keeps its buffer forever.
  bool try_wait(Pending& pending, double seconds);
  // Starts every collective of `group` (see Communicator::group_begin) and returns their Pendings, in order.
  struct Planned {
    CollKind kind;
    void* buf;
    size_t block;
    ElemType type;
    std::string label;
    ReducedSink* sink = nullptr;  // a reduce-scatter's (Collective::sink): host data only
  };
  std::vector<Pending> start_group(std::vector<Planned> group);
  void wait_all(std::vector<Pending>& pendings);

  // ---- Blocking data collectives (the ZeRO traffic): start and wait, with the timeout.
  // `buf` holds size() blocks of `block` elements; this rank's block (at rank() * block) is the input.
  void all_gather(void* buf, size_t block, ElemType type, const std::string& label);
  // `buf` holds size() blocks of `block` elements; afterwards this rank's block holds the sum over ranks.
  void reduce_scatter_sum(void* buf, size_t block, ElemType type, const std::string& label);
  // Float sum of `n` elements (a multiple of size()) on every rank: a reduce-scatter and an all-gather, so every
  // element is summed once (in rank order on a deterministic backend) and every rank gets the same bits.
  void all_reduce_sum(void* buf, size_t n, ElemType type, const std::string& label);
  // `host_memory`: the buffer is host memory on a device engine too (never staged through the device).
  void broadcast(void* buf, size_t n, ElemType type, int root, const std::string& label, bool host_memory = false);

  // ---- Control messages (counted apart).
  void control_min(int64_t* values, size_t n, const std::string& label);
  void control_all_gather(void* buf, size_t block_bytes, const std::string& label);
  void control_broadcast(void* buf, size_t n_bytes, int root, const std::string& label);
  // Rank `root`'s text on every rank.
  std::string broadcast_text(const std::string& text, int root, const std::string& label);
  // ---- Data of the step: the sum of every rank's `local` value, added in rank order on every rank (the same bits
  // everywhere, whatever the backend). Counted as an all-reduce of one fp64.
  double sum_over_ranks(double local, const std::string& label);

  // ---- The agreement before a collective call moves data. `local_error` is this rank's failure (or null).
  // Throws: this rank's own error if it failed; ZERO_ERR_REMOTE naming the lowest failed rank and its message on
  // the others; ZERO_ERR_MISMATCH on every rank if the tags differ: a Divergence if the ranks are in different
  // calls, a plain Error if only `check` differs. `explain_check`, if given, turns differing `check` values into a
  // message (it runs on every rank and may use control collectives). With `share_status`
  // the other ranks throw the failed rank's own status instead of ZERO_ERR_REMOTE (checkpoint files: a corrupt
  // or unwritable checkpoint is the same news for every rank).
  // Run by every rank of the group whose `check` values differ (the data-parallel group, or the model-parallel one).
  using ExplainCheck = std::function<std::string(EngineComm& ranks)>;
  void agree(const std::string& call_name, const CallTag& tag, const Error* local_error,
             const ExplainCheck& explain_check = {}, bool share_status = false);

  // Aborts the communicator (this rank stops; the others learn it). Any thread.
  void abort(const std::string& reason) { comm_->abort(reason); }
  // zero_comm_finalize reached the communicator or either side of a split one (the caller's own communicators).
  bool finalized() const {
    Communicator& c = *comm_;
    return c.finalized() || c.control_side().finalized() || c.data_side().finalized();
  }
  // A collective was given up while still in flight: its buffer must never be freed.
  bool abandoned_requests() const { return abandoned_; }
  // A collective failed (backend error, timeout, a rank gone): the ranks' collective sequences no longer match.
  bool failed() const { return failed_; }

  const CommStats& stats() const { return stats_; }
  // The flight recorder as JSON (zero_engine_recent_collectives). Any thread.
  std::string recent_json() const;

 private:
  enum class Counter { kAllGather, kReduceScatter, kAllReduce, kBroadcast, kControl, kNone };
  void run(Collective c, Counter counter, uint64_t bytes, uint64_t wire_bytes);
  // A small collective (control messages, the step's sum): its buffer is small and often on the caller's stack, and a
  // collective given up in flight may still be written by the backend later (no backend can cancel one: an MPI
  // request completes when the late ranks arrive). So it runs on a staging copy the communicator owns, copied back
  // when it completes; a staging buffer left in flight is kept and never freed.
  void run_small(Collective c, size_t total_bytes, Counter counter, uint64_t bytes, uint64_t wire_bytes);
  Pending start(Collective c, Counter counter, uint64_t bytes, uint64_t wire_bytes);
  // Host-staged: moves c's input into a host buffer and points c at it; the result's range is returned.
  void require_device_memory(CollKind kind, const void* buf, size_t count, ElemType type, const std::string& label);
  Pending::Staged stage_in(Collective& c);
  // Host-staged, after the collective completed: its result back into device memory (unless the engine is going
  // away: `copy_back` false), and the host buffer back.
  void stage_out(Pending& p, bool copy_back);
  // The collective completed in the backend: staged out, then recorded done. A copy back that fails breaks the
  // engine and aborts the communicator, so the others learn it in their next collective.
  void complete(Pending& p, bool copy_back = true);
  Pending start_data(CollKind kind, void* buf, size_t block, ElemType type, const std::string& label,
                     ReducedSink* sink = nullptr);
  void count(Counter counter, uint64_t bytes, uint64_t wire_bytes);

  std::shared_ptr<Communicator> comm_;
  double timeout_s_ = 600.0;
  bool data_in_device_memory_ = false;
  std::shared_ptr<DataStaging> staging_;
  void* data_queue_ = nullptr;
  bool any_order_ = false;
  std::string rank_name_ = "rank";
  CommStats stats_;
  bool abandoned_ = false;
  bool failed_ = false;
  std::unique_ptr<char[]> control_staging_;  // run_control's, reused while nothing is left in flight
  size_t control_staging_bytes_ = 0;
  FlightRecorder recorder_;
};

}  // namespace zero
