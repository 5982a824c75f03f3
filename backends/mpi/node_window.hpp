// Collectives through one MPI-3 shared-memory window, for a communicator whose ranks all share a node.
//
// Every rank owns a slot in the window: two halves used alternately (double buffering) and a line with its
// arrival counter. A collective moves its data in chunks that fit a half. For chunk s (counted over the
// communicator's life, the same on every rank because every rank runs the same collectives in the same order):
//   1. wait until every rank has arrived at s (it copied chunk s - 1 in, so it has finished reading chunk s - 2,
//      which used the half this chunk reuses);
//   2. copy this rank's input for the chunk into its half s % 2, then arrive at s + 1 (a release store);
//   3. wait until every rank has arrived at s + 1 (acquire loads), then read what this rank needs straight from
//      the peers' halves: a reduce-scatter sums its block's chunk from every slot in rank order 0..N-1 (the same
//      arithmetic as the all-to-all path, so the same bits); an all-gather copies every peer's chunk.
// One arrival per chunk, no MPI call, no temporary allocated per call (Open MPI's reduce-scatter page-faults fresh
// temporaries on every call). Waiting is polled: step() does what it can and returns false while a peer is behind,
// so the backend's wait loop keeps its timeout, its abort and its notices from ranks that stopped.
//
// The arrival counters are 64-bit atomics in shared memory, which x86-64 and AArch64 keep coherent across processes
// (lock-free atomics are address-free); the release/acquire pair orders the plain copies around them.
#pragma once

#include <mpi.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "comm/rank_order_sum.hpp"
#include "zero/zero.h"

namespace zero_mpi {

class NodeWindow {
 public:
  // Collective over `comm` (every rank must be on one node). Null when the window cannot be made (the caller then
  // uses MPI's collectives).
  static std::unique_ptr<NodeWindow> create(MPI_Comm comm, size_t half_bytes) {
    int rank = 0, size = 0;
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &size);
    // The chunk size is part of the protocol (every rank cuts a collective into the same chunks and finds its
    // peers' halves by it): the smallest any rank asked for, the same everywhere.
    unsigned long long agreed = half_bytes / 64 * 64;
    MPI_Allreduce(MPI_IN_PLACE, &agreed, 1, MPI_UNSIGNED_LONG_LONG, MPI_MIN, comm);
    // A reduce-scatter puts one share per rank in a half: each must hold at least a cache line.
    if (agreed < 64 * static_cast<unsigned long long>(size)) return nullptr;
    auto w = std::unique_ptr<NodeWindow>(new NodeWindow());
    w->rank_ = rank;
    w->size_ = size;
    w->half_ = static_cast<size_t>(agreed);
    const MPI_Aint bytes = static_cast<MPI_Aint>(kLine + 2 * w->half_);
    MPI_Info info;
    MPI_Info_create(&info);
    MPI_Info_set(info, "alloc_shared_noncontig", "true");  // each slot on its owner's NUMA node
    void* mine = nullptr;
    const int rc = MPI_Win_allocate_shared(bytes, 1, info, comm, &mine, &w->win_);
    MPI_Info_free(&info);
    int ok = rc == MPI_SUCCESS ? 1 : 0;
    if (ok) {
      w->slots_.resize(static_cast<size_t>(size));
      for (int r = 0; r < size && ok; ++r) {
        MPI_Aint sz = 0;
        int disp = 0;
        void* base = nullptr;
        ok = MPI_Win_shared_query(w->win_, r, &sz, &disp, &base) == MPI_SUCCESS && base != nullptr && sz >= bytes;
        w->slots_[static_cast<size_t>(r)] = static_cast<char*>(base);
      }
    }
    // Every rank must have the whole window, or none uses it.
    MPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_INT, MPI_MIN, comm);
    if (!ok) {
      if (rc == MPI_SUCCESS) MPI_Win_free(&w->win_);
      return nullptr;
    }
    std::memset(w->slots_[static_cast<size_t>(rank)], 0, kLine);
    __atomic_store_n(w->counter(rank), uint64_t{0}, __ATOMIC_RELEASE);
    MPI_Barrier(comm);  // every counter is 0 before anyone reads one
    return w;
  }

  // Collective (zero_comm_finalize).
  void free() {
    if (win_ != MPI_WIN_NULL) MPI_Win_free(&win_);
  }

  // A collective in progress through the window.
  struct Op {
    uint64_t sequence = 0;  // the communicator's collective number (checked against the peers')
    uint64_t count = 0;
    int32_t kind = 0;  // ZERO_COLL_REDUCE_SCATTER or ZERO_COLL_ALL_GATHER
    int32_t dtype = 0;
    bool first_chunk = true;
    char* buf = nullptr;
    size_t block_bytes = 0;  // one rank's block
    size_t esize = 1;
    size_t offset = 0;  // bytes of the block done
    bool copied = false;
  };

  Op begin(uint64_t sequence, int32_t kind, int32_t dtype, void* buf, uint64_t count, size_t esize) const {
    Op op;
    op.sequence = sequence;
    op.count = count;
    op.kind = kind;
    op.dtype = dtype;
    op.buf = static_cast<char*>(buf);
    op.esize = esize;
    op.block_bytes = static_cast<size_t>(count) * esize;
    return op;
  }

  enum class Progress { kWaiting, kDone, kMismatch };

  // Advances `op` as far as the peers allow, at most kChunksPerCall chunks (so that the caller's wait loop keeps
  // answering aborts and queries during a long collective). kMismatch: a peer is in another collective (mismatch()
  // says which); nothing was summed from it.
  Progress step(Op& op) {
    for (int done = 0; op.offset < op.block_bytes; ++done) {
      if (done == kChunksPerCall) return Progress::kWaiting;
      const size_t chunk = chunk_bytes(op);
      const uint64_t s = next_chunk_;
      char* my_half = half(rank_, s);
      if (!op.copied) {
        if (!all_arrived(s)) return Progress::kWaiting;
        if (op.kind == ZERO_COLL_REDUCE_SCATTER) {
          // The other blocks' chunks: each peer sums its own from here (this rank's block is read in place).
          for (int r = 0; r < size_; ++r)
            if (r != rank_)
              std::memcpy(my_half + static_cast<size_t>(r) * chunk, op.buf + r * op.block_bytes + op.offset, chunk);
        } else {
          std::memcpy(my_half, op.buf + rank_ * op.block_bytes + op.offset, chunk);
        }
        if (op.first_chunk) write_descriptor(s, op.sequence, op.kind, op.dtype, op.count);
        arrive(s);
        op.copied = true;
      }
      if (!all_arrived(s + 1)) return Progress::kWaiting;
      if (op.first_chunk) {
        if (!peers_agree(s, op.sequence, op.kind, op.dtype, op.count)) return Progress::kMismatch;
        op.first_chunk = false;
      }
      if (op.kind == ZERO_COLL_REDUCE_SCATTER) {
        sources_.resize(static_cast<size_t>(size_));
        char* mine = op.buf + rank_ * op.block_bytes + op.offset;
        for (int r = 0; r < size_; ++r)
          sources_[static_cast<size_t>(r)] = r == rank_ ? mine : half(r, s) + static_cast<size_t>(rank_) * chunk;
        zero::sum_in_rank_order(mine, sources_.data(), size_, chunk / op.esize, op.dtype);
      } else {
        for (int r = 0; r < size_; ++r)
          if (r != rank_) std::memcpy(op.buf + r * op.block_bytes + op.offset, half(r, s), chunk);
      }
      op.offset += chunk;
      op.copied = false;
      finish_chunk(s);
    }
    return Progress::kDone;
  }

  const std::string& mismatch() const { return mismatch_; }

  // ---- The chunk protocol's pieces, for collectives that cut their data differently (hierarchy.hpp): chunk s
  // (take next_chunk()) waits for all_arrived(s), writes this rank's half(rank(), s), arrive(s), waits for
  // all_arrived(s + 1), reads the peers' halves, then finish_chunk(s). On a collective's first chunk the rank writes
  // its descriptor before arriving and checks the peers' after.
  int rank() const { return rank_; }
  int size() const { return size_; }
  size_t half_bytes() const { return half_; }
  uint64_t next_chunk() const { return next_chunk_; }
  void finish_chunk(uint64_t s) { next_chunk_ = s + 1; }
  char* half(int r, uint64_t s) const { return slots_[static_cast<size_t>(r)] + kLine + (s % 2) * half_; }
  bool all_arrived(uint64_t s) const {
    for (int r = 0; r < size_; ++r)
      if (__atomic_load_n(counter(r), __ATOMIC_ACQUIRE) < s) return false;
    return true;
  }
  void arrive(uint64_t s) { __atomic_store_n(counter(rank_), s + 1, __ATOMIC_RELEASE); }
  // Beside the counter, two descriptors of the collective whose first chunk is s (slot s % 2, reused two chunks
  // later, when every peer has read it): its sequence number, kind and dtype, count. Peers check them on the
  // first chunk, so that ranks out of step fail instead of summing each other's unrelated data.
  void write_descriptor(uint64_t s, uint64_t sequence, int32_t kind, int32_t dtype, uint64_t count) {
    uint64_t* d = descriptor(rank_, s);
    d[0] = sequence;
    d[1] = (static_cast<uint64_t>(static_cast<uint32_t>(kind)) << 32) | static_cast<uint32_t>(dtype);
    d[2] = count;
  }
  // False (and mismatch() says how) when a peer wrote another descriptor. `describe` names a peer for the message
  // (its rank in the window by default).
  bool peers_agree(uint64_t s, uint64_t sequence, int32_t kind, int32_t dtype, uint64_t count,
                   const std::vector<int>* names = nullptr) {
    const uint64_t* mine = descriptor(rank_, s);
    for (int r = 0; r < size_; ++r) {
      const uint64_t* d = descriptor(r, s);
      if (d[0] == mine[0] && d[1] == mine[1] && d[2] == mine[2]) continue;
      const int name = names != nullptr ? (*names)[static_cast<size_t>(r)] : r;
      mismatch_ = "rank " + std::to_string(name) + " is in collective #" + std::to_string(d[0]) + " (kind " +
                  std::to_string(d[1] >> 32) + ", dtype " + std::to_string(d[1] & 0xffffffffu) + ", " +
                  std::to_string(d[2]) + " elements per rank) while this rank is in #" + std::to_string(sequence) +
                  " (kind " + std::to_string(kind) + ", dtype " + std::to_string(dtype) + ", " + std::to_string(count) +
                  ")";
      return false;
    }
    return true;
  }

 private:
  static constexpr size_t kLine = 64;  // the arrival counter and two descriptors (56 bytes), at the start of a slot

  static constexpr int kChunksPerCall = 64;

  NodeWindow() = default;
  uint64_t* counter(int r) const { return reinterpret_cast<uint64_t*>(slots_[static_cast<size_t>(r)]); }
  uint64_t* descriptor(int r, uint64_t s) const { return counter(r) + 1 + 3 * (s % 2); }
  // A reduce-scatter puts every rank's share of the chunk in a half; an all-gather only its own. Whole elements.
  size_t chunk_bytes(const Op& op) const {
    size_t per = op.kind == ZERO_COLL_REDUCE_SCATTER ? half_ / static_cast<size_t>(size_) : half_;
    if (per >= 64) per = per / 64 * 64;  // every share starts on a cache line
    const size_t whole = std::max<size_t>(op.esize, per / op.esize * op.esize);
    return std::min(whole, op.block_bytes - op.offset);
  }

  int rank_ = 0, size_ = 1;
  size_t half_ = 0;
  MPI_Win win_ = MPI_WIN_NULL;
  std::vector<char*> slots_;
  std::vector<const void*> sources_;
  std::string mismatch_;
  uint64_t next_chunk_ = 0;  // chunk s waits for every counter to reach s (chunk 0: the initial 0s)
};

}  // namespace zero_mpi
