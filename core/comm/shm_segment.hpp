// The shared-memory communicator's segment: one POSIX shared-memory object per job, holding a line per rank (its
// process id, its state, what it waits in, why it stopped), the node window's slots (node_window.hpp) and, sparse
// after them, every rank's share of the shared arena (shared_arena.hpp).
//
// Rank 0 creates the object under the job's name (O_EXCL: a name in use is an error, never a silent join of
// another job's ranks), sizes it and marks it ready; the others open it when it appears. Once every rank has
// joined, rank 0 unlinks the name, so a job that dies leaves nothing behind in /dev/shm. Each rank's line is
// written by that rank only (its state by any of its threads, through atomics) and read by everyone: the failure
// protocol of the communicator (shm_communicator.hpp) is built on it. A rank killed before every rank joined leaves
// the name behind (rank 0 removes it when it gives up; a name is a job's, so no later job trips on it).
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "comm/shared_arena.hpp"

namespace zero {

// What a rank's line says it is doing.
enum class ShmRankState : uint64_t {
  kJoining = 0,
  kLive = 1,
  kStopped = 2,    // aborted, destroyed its communicator, or exiting: `reason` says why
  kFinalized = 3,  // zero_comm_finalize: it takes part in no more collectives
};

class ShmSegment {
 public:
  // What rank 0 chooses for the job (the other ranks' values are ignored).
  struct Settings {
    size_t half_bytes = 0;        // the window's chunk buffers
    size_t arena_bytes = 0;       // each rank's share of the shared arena (0: none)
    size_t direct_min_bytes = 0;  // the window's single-copy threshold per block (node_window.hpp)
  };
  // Maps the job's segment for `rank` of `size` (collective: returns when every rank has joined, or throws
  // zero::Error after `join_timeout_s` naming who did not).
  ShmSegment(const std::string& name, int rank, int size, const Settings& settings, double join_timeout_s);
  ~ShmSegment();
  ShmSegment(const ShmSegment&) = delete;
  ShmSegment& operator=(const ShmSegment&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  size_t half_bytes() const { return half_; }
  size_t direct_min_bytes() const { return direct_min_; }
  // Every rank's slot for the node window, mapped here.
  std::vector<char*> slots() const;
  // The shared arena (shared_arena.hpp), or null when rank 0 gave it no bytes; it outlives the segment while a
  // buffer from it lives.
  const std::shared_ptr<SharedArena>& arena() const { return arena_; }

  // ---- This rank's line (any thread).
  // The first reason wins; later calls change nothing. `after`: the highest collective this rank completed.
  void stop(ShmRankState how, uint64_t after, const std::string& reason);
  void set_completed(uint64_t sequence);
  // The collective this rank waits in (0: none) and what it is, for the peers' diagnosis.
  void set_waiting(uint64_t sequence, const std::string& label);
  // A word for the setup's agreements (read by the peers after the next barrier).
  void set_vote(uint64_t vote);

  // ---- The peers' lines.
  struct PeerView {
    ShmRankState state = ShmRankState::kJoining;
    pid_t pid = 0;
    uint64_t completed = 0;      // the highest collective it completed
    uint64_t stopped_after = 0;  // kStopped / kFinalized: the highest it completed when it stopped
    uint64_t waiting = 0;        // the collective it waits in (0: none)
    double waiting_for_s = 0;    // since when
    std::string label, reason;   // what it waits in; why it stopped
    uint64_t vote = 0;
  };
  PeerView peer(int r) const;
  // Whether peer r's process has ended (gone, a zombie, or its pid another process's), checked through /proc: a
  // rank killed by a signal writes no reason. Always false once the checks are off.
  bool peer_process_gone(int r) const;
  // Whether rank r is inside collective `sequence` or a later one, has completed it, has stopped, or its process is
  // gone: it has nothing more to say about that collective.
  bool settled(int r, uint64_t sequence) const;
  // What rank r is doing, as a timeout's diagnosis words it (" rank J waits in collective #n (...) for 2.5 s;"),
  // naming it `job_rank`.
  std::string describe(int r, int job_rank) const;
  // Whether every rank's process is visible here as the one that joined (ranks in other pid namespaces, containers
  // sharing /dev/shm, are not); the owner turns the process checks off otherwise.
  bool peers_visible() const;
  void set_process_checks(bool on) { process_checks_ = on; }
  // Setup barrier number `phase` (1, 2, ...): waits until every rank has reached it; throws after the timeout or
  // when a rank stops or dies meanwhile. `what` names the step in the error.
  void barrier(uint64_t phase, double timeout_s, const char* what);

 private:
  struct Header;
  struct RankLine;
  RankLine* line(int r) const;
  Header* header() const;

  std::string name_;
  int rank_ = 0, size_ = 1;
  size_t half_ = 0, direct_min_ = 0;
  size_t slot_stride_ = 0, slots_offset_ = 0;
  void* base_ = nullptr;
  size_t bytes_ = 0;  // mapped here: the lines and slots (the arena maps the rest itself)
  std::shared_ptr<SharedArena> arena_;
  bool process_checks_ = true;
};

}  // namespace zero
