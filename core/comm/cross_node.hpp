// The collectives of a shared-memory communicator whose ranks span several machines: each node's window
// (node_window.hpp), and TCP between the ranks with the same place on every node (tcp_link.hpp) — no MPI.
//
// Reduce-scatter and all-gather are the hierarchical ones (hierarchy.hpp: the nodes continue one rank-order sum,
// the bits of every other path). An all-reduce all-gathers every rank's vector and folds them in rank order, as
// the one-node window does (the agreements' few bytes; the same min, max or sum, the same bits). A broadcast sends
// the root's buffer to its column's rank on every other node, each behind a header that is checked, and then each
// node's window gives it to that node's ranks; then each of those column ranks answers with its own header, and the
// root's node completes last (a failure anywhere, or a broadcast the machines disagree on, fails it there too).
//
// Only one thread at a time may step it (the communicator's queue lock); tell_peers may be called from any.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "comm/hierarchy.hpp"
#include "comm/node_window.hpp"
#include "comm/tcp_link.hpp"

namespace zero {

class CrossNode {
 public:
  // Over this node's `window` (shared with the communicator) and this rank's column `link`.
  CrossNode(std::shared_ptr<NodeWindow> window, std::unique_ptr<TcpColumnLink> link, int node, int nodes);

  struct Op {
    int32_t kind = 0;
    int32_t dtype = 0;
    int32_t reduce_op = 0;
    int root = 0;
    char* buf = nullptr;
    uint64_t count = 0;
    size_t esize = 1;
    uint64_t sequence = 0;
    int phase = 0;            // all-reduce: 0 gather, 1 done; broadcast: step_broadcast's
    Hierarchy::Op gather;     // reduce-scatter, all-gather, an all-reduce's gather
    NodeWindow::Op local;     // a broadcast's window part
    std::vector<char> every;  // an all-reduce: every rank's vector, in rank order
    // A broadcast's messages over the link, with what each is.
    enum class Message { kSend, kHeader, kData, kAcknowledgement };
    struct Transfer {
      ColumnLink::Request request = ColumnLink::kNoRequest;
      Message what = Message::kSend;
      size_t bytes = 0;  // a receive: the bytes expected
      int node = 0;      // the peer's node
    };
    std::vector<Transfer> transfers;
    size_t transfers_done = 0;
    char header[32] = {};                // a broadcast's header, as this rank has it
    char received_header[32] = {};       // the root's column's, received
    std::vector<char> acknowledgements;  // the root's column rank: every other node's header, 32 bytes each
  };

  Op begin(uint64_t sequence, int32_t kind, int32_t dtype, void* buf, uint64_t count, size_t esize, int32_t reduce_op,
           int root);

  enum class Progress { kWaiting, kDone, kMismatch, kFailed };
  // Advances `op` as far as the peers allow. kMismatch / kFailed: error() says why.
  Progress step(Op& op);
  const std::string& error() const { return error_; }

  // This rank stops after taking part in the collectives up to #after: its column peers hear why (any thread).
  void tell_peers(uint64_t after, const std::string& why) { link_->tell_peers(std::to_string(after) + " " + why, 0.1); }
  // A rank of another node (this rank's counterpart there) that said it stopped before collective `sequence`, as
  // the communicator names a rank of its own node that did; with `any`, one that said it stopped at all. "" if none.
  std::string stopped_peer(uint64_t sequence, const std::string& label, bool any) const;
  // What a rank that timed out learns of the other machines. ask() sends the collective's number to this rank's
  // column peers; each answers at once with its machine's description (`describe`, given that number), from
  // whichever thread moves its link (it must not call the link). A machine whose column rank is in no libzero call
  // does not answer (nothing moves its link). poll() moves the link (answering questions); any thread.
  struct Machine {
    bool answered = false;
    bool settled = false;  // every rank there is inside that collective or a later one, or has stopped
    std::string lines;     // one per rank there, as the communicator's diagnosis words them
  };
  void answer_with(std::function<Machine(uint64_t sequence)> describe);
  void ask(uint64_t sequence) { link_->ask_peers(std::to_string(sequence)); }
  // Node n's answer to the question about collective `sequence` (not answered: none yet).
  Machine machine(int node, uint64_t sequence) const;
  void poll() { link_->progress(); }
  // The words node n's column rank said before it stopped (its notice: "<after> <reason>"), or "".
  std::string notice(int node) const { return link_->notice(node); }

  // Collective (zero_comm_finalize): the link says goodbye.
  void free() { hierarchy_->link().free(); }

 private:
  Progress step_broadcast(Op& op);
  Progress finish_transfers(Op& op);
  Progress from_hierarchy(Hierarchy::Progress p);

  std::shared_ptr<NodeWindow> window_;
  TcpColumnLink* link_;  // owned by the hierarchy
  std::unique_ptr<Hierarchy> hierarchy_;
  int node_, nodes_;
  std::string error_;
};

// "rank R has stopped: <why>. It took part in the collectives up to #after, so collective #sequence (label) cannot
// complete" — or `why` itself where it already says that of the rank that stopped first (a rank that stopped
// because another did relays that one's words: the cause is named once, however many ranks passed it on).
std::string stopped_rank_message(int rank, const std::string& why, uint64_t after, uint64_t sequence,
                                 const std::string& label);

// `every` holds `n` vectors of `count` elements of `dtype` (ZERO_DTYPE_FP32, _FP64 or _INT64), one per rank; dst
// becomes their element-wise min, max or sum, folded in rank order from rank 0's (as the window's all-reduce).
void reduce_vectors_in_rank_order(void* dst, const void* every, int n, size_t count, int32_t dtype, int32_t reduce_op);

}  // namespace zero
