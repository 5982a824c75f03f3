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
    auto w = std::unique_ptr<NodeWindow>(new NodeWindow());
    w->rank_ = rank;
    w->size_ = size;
    w->half_ = half_bytes / 64 * 64;
    const MPI_Aint bytes = static_cast<MPI_Aint>(kLine + 2 * w->half_);
    MPI_Info info;
    MPI_Info_create(&info);
    MPI_Info_set(info, "alloc_shared_noncontig", "true");  // each slot on its owner's NUMA node
    void* mine = nullptr;
    const int rc = MPI_Win_allocate_shared(bytes, 1, info, comm, &mine, &w->win_);
    MPI_Info_free(&info);
    int ok = rc == MPI_SUCCESS ? 1 : 0;
    // Every rank must have its window, or none uses it.
    MPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_INT, MPI_MIN, comm);
    if (!ok) {
      if (rc == MPI_SUCCESS) MPI_Win_free(&w->win_);
      return nullptr;
    }
    w->slots_.resize(static_cast<size_t>(size));
    for (int r = 0; r < size; ++r) {
      MPI_Aint sz = 0;
      int disp = 0;
      void* base = nullptr;
      MPI_Win_shared_query(w->win_, r, &sz, &disp, &base);
      w->slots_[static_cast<size_t>(r)] = static_cast<char*>(base);
    }
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
    int32_t kind = 0;  // ZERO_COLL_REDUCE_SCATTER or ZERO_COLL_ALL_GATHER
    int32_t dtype = 0;
    char* buf = nullptr;
    size_t block_bytes = 0;  // one rank's block
    size_t esize = 1;
    size_t offset = 0;  // bytes of the block done
    bool copied = false;
  };

  Op begin(int32_t kind, int32_t dtype, void* buf, uint64_t count, size_t esize) const {
    Op op;
    op.kind = kind;
    op.dtype = dtype;
    op.buf = static_cast<char*>(buf);
    op.esize = esize;
    op.block_bytes = static_cast<size_t>(count) * esize;
    return op;
  }

  // Advances `op` as far as the peers allow. True when it is complete.
  bool step(Op& op) {
    while (op.offset < op.block_bytes) {
      const size_t chunk = chunk_bytes(op);
      const uint64_t s = next_chunk_;
      char* my_half = half(rank_, s);
      if (!op.copied) {
        if (!all_arrived(s)) return false;
        if (op.kind == ZERO_COLL_REDUCE_SCATTER) {
          // The other blocks' chunks: each peer sums its own from here (this rank's block is read in place).
          for (int r = 0; r < size_; ++r)
            if (r != rank_)
              std::memcpy(my_half + static_cast<size_t>(r) * chunk, op.buf + r * op.block_bytes + op.offset, chunk);
        } else {
          std::memcpy(my_half, op.buf + rank_ * op.block_bytes + op.offset, chunk);
        }
        __atomic_store_n(counter(rank_), s + 1, __ATOMIC_RELEASE);
        op.copied = true;
      }
      if (!all_arrived(s + 1)) return false;
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
      next_chunk_ = s + 1;
    }
    return true;
  }

 private:
  static constexpr size_t kLine = 64;  // the arrival counter's cache line, at the start of a slot

  NodeWindow() = default;
  uint64_t* counter(int r) const { return reinterpret_cast<uint64_t*>(slots_[static_cast<size_t>(r)]); }
  char* half(int r, uint64_t s) const { return slots_[static_cast<size_t>(r)] + kLine + (s % 2) * half_; }
  bool all_arrived(uint64_t s) const {
    for (int r = 0; r < size_; ++r)
      if (__atomic_load_n(counter(r), __ATOMIC_ACQUIRE) < s) return false;
    return true;
  }
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
  uint64_t next_chunk_ = 0;  // chunk s waits for every counter to reach s (chunk 0: the initial 0s)
};

}  // namespace zero_mpi
