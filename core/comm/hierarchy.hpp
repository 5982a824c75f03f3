// Reduce-scatters and all-gathers across nodes: each node's ranks share one window (node_window.hpp's chunk
// protocol), and ranks with the same place on different nodes exchange messages over a column link (column_link.hpp:
// MPI in the MPI module, TCP in the shared-memory communicator) — with the bits of the one-node paths.
//
// Layout: N = M nodes x L ranks, node k holding the consecutive ranks kL .. kL + L - 1 (mpirun's and torchrun's
// default placement; the communicators use this path only then). Rank (k, l) is local rank l of node k; the ranks
// (0, l) .. (M - 1, l) form a "column", in which (k, l) is node k.
//
// Reduce-scatter. Block j's sum must be ((x_0 + x_1) + x_2) + ... + x_{N-1}, the left fold in rank order that every
// other path computes, so the nodes continue one sum rather than adding up node totals (which would round
// differently): node 0 folds its ranks, node 1 continues from node 0's partial sums, and so on; node M - 1 rounds
// the result and sends each block to its owner. The work is split by column: local rank l folds the M blocks owned
// by column l (blocks nL + l), reading its local peers' contributions from the window, and sends the M partial sums
// (fp32, unrounded: a bf16 sum is rounded once, at the end, as on every path) to (k + 1, l); on the last node it
// sends block nL + l's result to (n, l). Chunk by chunk, so the nodes work as a pipeline; each chunk's message
// carries a header (the collective's number, the chunk's, the count, kind and dtype), checked with its size on
// arrival.
//
// All-gather. (k, l) first exchanges its own block with the other nodes' (n, l) over the link, a header and then the
// block straight into the caller's buffer; then the node's window gives every local rank the M blocks each of its
// peers holds.
//
// Inter-node traffic per rank: a reduce-scatter sends M x count fp32 partial sums and, from the last node, M - 1
// blocks; an all-gather M - 1 blocks — where the one-node-at-a-time all-to-all sends N - L raw blocks. Only one
// thread at a time may step it (the owner's lock); MPI's link allows only the thread inside the backend's waits.
//
// Staging: one set of message buffers (kSlots chunks ahead in each direction), owned here and used by one
// collective at a time (the communicators move their collectives strictly in start order). Never allocated per
// call.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "comm/column_link.hpp"
#include "comm/node_window.hpp"

namespace zero {

class Hierarchy {
 public:
  // Over this node's `window` (its ranks are the node's L consecutive ranks, local rank = window rank) and this
  // rank's column `link`; `node` of `nodes`. The window's halves must hold a cache line per rank of the job.
  Hierarchy(std::shared_ptr<NodeWindow> window, std::unique_ptr<ColumnLink> link, int node, int nodes);
  // Requests still in flight (a collective given up) may still write into the staging: then it is kept for the
  // life of the process, reachable from a registry (so that LeakSanitizer does not call it lost), never freed.
  ~Hierarchy();
  Hierarchy(const Hierarchy&) = delete;
  Hierarchy& operator=(const Hierarchy&) = delete;

  // Collective (zero_comm_finalize): the window's memory and the link.
  void free();

  int nodes() const { return nodes_; }
  int locals() const { return locals_; }
  ColumnLink& link() { return *link_; }

  // Test hook: the last node folds each chunk this much later, so that the nodes before it wait for their reduced
  // blocks with their next partial sums already arrived (the state a retest of a completed receive went wrong in).
  void set_last_node_delay_us(int us) { slow_last_node_us_ = us; }

  enum class Progress { kWaiting, kDone, kMismatch, kFailed };

  struct Op {
    uint64_t sequence = 0;
    int32_t kind = 0;  // ZERO_COLL_REDUCE_SCATTER or ZERO_COLL_ALL_GATHER: how the data moves
    // What the caller runs through it (an all-reduce gathers everyone's vectors) and its op or root: carried in
    // every header and descriptor, so that ranks in different collectives fail even when the data moves alike.
    int32_t called = 0;
    uint32_t detail = 0;
    int32_t dtype = 0;
    char* buf = nullptr;
    uint64_t count = 0;  // elements per block
    size_t esize = 1;
    size_t piece = 0;     // elements of each block in one chunk
    uint64_t chunks = 0;  // the window's chunks this collective takes
    uint64_t chunk = 0;   // the chunk being moved
    uint64_t s = 0;       // its number in the window's protocol
    int phase = 0;        // within the chunk: kCopy, kPeers, kFold
    bool first = true;    // the first chunk (descriptors are written and checked)
    // Reduce-scatter: partial sums received ahead, final blocks received and copied in.
    uint64_t partials_posted = 0, finals_posted = 0, finals_done = 0;
    // The chunk's partial sums from node k - 1 have arrived and been checked. Their receive's request is done
    // from then on, and testing a done request reports an empty message: it must not be tested again when the
    // fold waits for something else.
    bool partial_ready = false;
    // All-gather: the exchange over the column, started and completed.
    bool exchange_started = false, exchanged = false;
  };

  // `called` and `detail` (an all-reduce's op, a broadcast's root): see Op; by default the collective itself.
  Op begin(uint64_t sequence, int32_t kind, int32_t dtype, void* buf, uint64_t count, size_t esize, int32_t called = -1,
           uint32_t detail = 0) const;

  // Advances `op` as far as the peers allow (a bounded amount of work per call). kMismatch / kFailed: error()
  // says why; the communicator is unusable afterwards.
  // The link moves first: a sender waiting on its window must not hold back what its peers wait for.
  Progress step(Op& op) {
    link_->progress();
    return op.kind == ZERO_COLL_REDUCE_SCATTER ? step_reduce_scatter(op) : step_all_gather(op);
  }

  const std::string& error() const { return error_; }

 private:
  using Request = ColumnLink::Request;
  static constexpr size_t kSlots = 4;  // chunks in flight ahead per direction
  // Every message starts with (or, for an all-gather's blocks, is preceded by) a header: the collective's number,
  // the chunk's (kExchange for an all-gather's), the count and the kind and dtype — checked on arrival with the
  // message's size, so ranks in different collectives fail instead of summing or copying each other's data. A rank
  // in another kind of collective sends a message the receive does not expect, which fails its check rather than
  // waiting for a message that never comes.
  static constexpr size_t kHeader = 32;
  static constexpr uint64_t kExchange = UINT64_MAX;
  static constexpr int kChunksPerCall = 64;               // as node_window.hpp's
  static constexpr size_t kMaxMessage = size_t{1} << 30;  // an all-gather's block goes in pieces of at most this
  enum Phase { kCopy = 0, kPeers = 1, kFold = 2 };

  bool test(Request& r, bool& done, const char* what, size_t* received = nullptr);
  Progress test_failure() const { return truncated_ ? Progress::kMismatch : Progress::kFailed; }
  bool started(bool ok, const char* what);

  size_t chunk_elems(const Op& op, uint64_t t) const;
  char* block(const Op& op, int node, int local, uint64_t offset) const;
  char* partial_in(uint64_t t) { return partial_in_.data() + (t % kSlots) * partial_bytes_; }
  char* partial_out(uint64_t t) { return partial_out_.data() + (t % kSlots) * partial_bytes_; }
  char* final_in(uint64_t t) { return final_in_.data() + (t % kSlots) * final_bytes_; }
  char* final_out(uint64_t t, int node) {
    return final_out_.data() + ((t % kSlots) * static_cast<size_t>(nodes_) + static_cast<size_t>(node)) * final_bytes_;
  }
  static uint64_t signature(const Op& op);
  static void write_header(char* m, const Op& op, uint64_t t);
  bool header_matches(const char* m, size_t got, size_t bytes, const Op& op, uint64_t t, int from_node,
                      const char* what);
  bool local_peers_agree(Op& op);

  Progress step_reduce_scatter(Op& op);
  Progress step_all_gather(Op& op);

  std::shared_ptr<NodeWindow> window_;  // shared with a communicator that runs other collectives through it
  std::unique_ptr<ColumnLink> link_;
  int local_ = 0, locals_ = 1, nodes_ = 1, node_ = 0;
  std::vector<int> window_names_;  // the job's ranks of this node's window ranks
  size_t partial_bytes_ = 0, final_bytes_ = 0;
  std::vector<char> partial_in_, partial_out_, final_out_, final_in_;
  std::vector<Request> partial_in_req_, partial_out_req_, final_out_req_, final_in_req_, exchange_req_;
  struct Exchange {
    int node;   // the peer's node
    int bytes;  // a block's piece received: its size; -1: a header received; -2: a send
  };
  std::vector<Exchange> exchange_what_;        // per exchange request
  std::vector<char> headers_in_, header_out_;  // an all-gather's headers: one from each node, one sent to all
  std::vector<const void*> sources_;
  std::string error_;
  bool truncated_ = false;
  int slow_last_node_us_ = 0;
};

}  // namespace zero
