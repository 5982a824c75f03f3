// An engine's view of its communicator: the same collectives, each counted (calls, payload bytes, wire bytes)
// and numbered. Counting here rather than in a backend keeps the statistics per engine and identical for every
// backend, so the traffic formulas in the tests check the engine, not a backend's bookkeeping.
#pragma once

#include <memory>
#include <string>

#include "comm/communicator.hpp"

namespace zero {

struct CommKindStats {
  uint64_t calls = 0;
  uint64_t bytes = 0;       // payload, as nccl-tests counts "size"
  uint64_t wire_bytes = 0;  // sent by one rank in a bandwidth-optimal algorithm
};

struct CommStats {
  uint64_t sequence = 0;
  CommKindStats all_gather, reduce_scatter, all_reduce, broadcast;
};

class CountedComm {
 public:
  explicit CountedComm(std::shared_ptr<Communicator> comm) : comm_(std::move(comm)) {}
  int rank() const { return comm_->rank(); }
  int size() const { return comm_->size(); }
  int local_size() const { return comm_->local_size(); }

  void all_gather_inplace(void* buf, size_t block_elems, ElemType type);
  void reduce_scatter_sum_inplace(void* buf, size_t block_elems, ElemType type);
  void all_reduce_inplace(void* buf, size_t n_elems, ElemType type, ReduceOp op);
  void broadcast(void* buf, size_t n_bytes, int root);

  // Rank `root`'s text on every rank (two broadcasts: the length, then the bytes).
  std::string broadcast_text(const std::string& text, int root);

  const CommStats& stats() const { return stats_; }

 private:
  void count(CommKindStats& kind, uint64_t bytes, uint64_t wire_bytes);
  std::shared_ptr<Communicator> comm_;
  CommStats stats_;
};

}  // namespace zero
