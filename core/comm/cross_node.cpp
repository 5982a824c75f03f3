#include "comm/cross_node.hpp"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "zero/zero.h"

namespace zero {
namespace {

constexpr size_t kHeader = 32;
constexpr size_t kMaxMessage = size_t{1} << 30;  // a broadcast goes in pieces of at most this

template <typename T>
void fold(T* dst, const T* every, int n, size_t count, int32_t reduce_op) {
  for (size_t i = 0; i < count; ++i) {
    T acc = every[i];
    for (int r = 1; r < n; ++r) {
      const T v = every[static_cast<size_t>(r) * count + i];
      acc = reduce_op == ZERO_REDUCE_MIN   ? (v < acc ? v : acc)
            : reduce_op == ZERO_REDUCE_MAX ? (v > acc ? v : acc)
                                           : acc + v;
    }
    dst[i] = acc;
  }
}

// The hierarchy's header layout (its messages and these meet on one link): the collective's number, a chunk number
// no hierarchy message uses, the count, and the kind, dtype and root.
void write_header(char* h, const CrossNode::Op& op) {
  const uint64_t words[4] = {op.sequence, UINT64_MAX - 1, op.count,
                             (static_cast<uint64_t>(static_cast<uint16_t>(op.kind)) << 48) |
                                 (static_cast<uint64_t>(static_cast<uint16_t>(op.dtype)) << 32) |
                                 static_cast<uint32_t>(op.root)};
  std::memcpy(h, words, sizeof words);
}

}  // namespace

std::string stopped_rank_message(int rank, const std::string& why, uint64_t after, uint64_t sequence,
                                 const std::string& label) {
  const std::string tail = "so collective #" + std::to_string(sequence) + " (" + label + ") cannot complete";
  const bool relayed = why.rfind("rank ", 0) == 0 && why.find(" has stopped: ") != std::string::npos &&
                       why.size() > tail.size() && why.compare(why.size() - tail.size(), tail.size(), tail) == 0;
  if (relayed) return why;
  return "rank " + std::to_string(rank) + " has stopped: " + why + ". It took part in the collectives up to #" +
         std::to_string(after) + ", so collective #" + std::to_string(sequence) + " (" + label + ") cannot complete";
}

void reduce_vectors_in_rank_order(void* dst, const void* every, int n, size_t count, int32_t dtype, int32_t reduce_op) {
  if (dtype == ZERO_DTYPE_FP64)
    fold(static_cast<double*>(dst), static_cast<const double*>(every), n, count, reduce_op);
  else if (dtype == ZERO_DTYPE_INT64)
    fold(static_cast<int64_t*>(dst), static_cast<const int64_t*>(every), n, count, reduce_op);
  else
    fold(static_cast<float*>(dst), static_cast<const float*>(every), n, count, reduce_op);
}

CrossNode::CrossNode(std::shared_ptr<NodeWindow> window, std::unique_ptr<TcpColumnLink> link, int node, int nodes)
    : window_(window), link_(link.get()), node_(node), nodes_(nodes) {
  std::vector<std::string> names;
  for (int n = 0; n < nodes; ++n) names.push_back("rank " + std::to_string(n * window_->size() + window_->rank()));
  link_->name_peers(std::move(names));
  hierarchy_ = std::make_unique<Hierarchy>(std::move(window), std::move(link), node, nodes);
}

// A question: the collective's number. An answer: that number, whether every rank there has settled (1 or 0), and
// the lines, as "<number> <settled> <lines>".
void CrossNode::answer_with(std::function<Machine(uint64_t sequence)> describe) {
  link_->answer_questions_with([describe = std::move(describe)](const std::string& question) {
    const uint64_t sequence = std::strtoull(question.c_str(), nullptr, 10);
    const Machine m = describe(sequence);
    return std::to_string(sequence) + (m.settled ? " 1 " : " 0 ") + m.lines;
  });
}

CrossNode::Machine CrossNode::machine(int node, uint64_t sequence) const {
  Machine m;
  const std::string answer = link_->answer(node);
  const size_t space = answer.find(' ');
  if (space == std::string::npos || answer.size() < space + 3 || std::strtoull(answer.c_str(), nullptr, 10) != sequence)
    return m;
  m.answered = true;
  m.settled = answer[space + 1] == '1';
  m.lines = answer.substr(space + 3);
  return m;
}

std::string CrossNode::stopped_peer(uint64_t sequence, const std::string& label, bool any) const {
  for (int n = 0; n < nodes_; ++n) {
    if (n == node_) continue;
    const std::string notice = link_->notice(n);
    const size_t space = notice.find(' ');
    if (space == std::string::npos) continue;
    const uint64_t after = std::strtoull(notice.c_str(), nullptr, 10);
    if (after >= sequence && !any) continue;
    return stopped_rank_message(n * window_->size() + window_->rank(), notice.substr(space + 1), after, sequence,
                                label);
  }
  return "";
}

CrossNode::Op CrossNode::begin(uint64_t sequence, int32_t kind, int32_t dtype, void* buf, uint64_t count, size_t esize,
                               int32_t reduce_op, int root) {
  Op op;
  op.sequence = sequence;
  op.kind = kind;
  op.dtype = dtype;
  op.reduce_op = reduce_op;
  op.root = root;
  op.buf = static_cast<char*>(buf);
  op.count = count;
  op.esize = esize;
  const int size = nodes_ * window_->size();
  if (kind == ZERO_COLL_REDUCE_SCATTER || kind == ZERO_COLL_ALL_GATHER) {
    op.gather = hierarchy_->begin(sequence, kind, dtype, buf, count, esize);
  } else if (kind == ZERO_COLL_ALL_REDUCE) {
    // This rank's vector in its place among everyone's, gathered, then folded.
    op.every.resize(static_cast<size_t>(size) * count * esize);
    const int rank = node_ * window_->size() + window_->rank();
    std::memcpy(op.every.data() + static_cast<size_t>(rank) * count * esize, buf, count * esize);
    op.gather = hierarchy_->begin(sequence, ZERO_COLL_ALL_GATHER, dtype, op.every.data(), count, esize,
                                  ZERO_COLL_ALL_REDUCE, static_cast<uint32_t>(reduce_op));
  }
  return op;
}

CrossNode::Progress CrossNode::from_hierarchy(Hierarchy::Progress p) {
  if (p == Hierarchy::Progress::kMismatch || p == Hierarchy::Progress::kFailed) error_ = hierarchy_->error();
  switch (p) {
    case Hierarchy::Progress::kWaiting:
      return Progress::kWaiting;
    case Hierarchy::Progress::kDone:
      return Progress::kDone;
    case Hierarchy::Progress::kMismatch:
      return Progress::kMismatch;
    default:
      return Progress::kFailed;
  }
}

CrossNode::Progress CrossNode::step(Op& op) {
  if (op.kind == ZERO_COLL_REDUCE_SCATTER || op.kind == ZERO_COLL_ALL_GATHER)
    return from_hierarchy(hierarchy_->step(op.gather));
  if (op.kind == ZERO_COLL_BROADCAST) return step_broadcast(op);
  // All-reduce.
  const Progress p = from_hierarchy(hierarchy_->step(op.gather));
  if (p != Progress::kDone) return p;
  reduce_vectors_in_rank_order(op.buf, op.every.data(), nodes_ * window_->size(), op.count, op.dtype, op.reduce_op);
  std::vector<char>().swap(op.every);
  return Progress::kDone;
}

// Phase 0, the root's column: the root's rank sends its header and its buffer (in pieces) to its column's rank on
// every other node, and each of those receives them and checks the header against its own. Phase 1: every node's
// window broadcasts from its rank of that column. Phase 2: each of those ranks sends its own header back, and the
// root's rank waits for them before its own node's window: the root's node completes only after every other node
// has, so that a rank that fails anywhere fails the broadcast on the root's machine too, and a broadcast the
// machines disagree on fails on both sides.
CrossNode::Progress CrossNode::step_broadcast(Op& op) {
  using Message = Op::Message;
  const int locals = window_->size();
  const int root_node = op.root / locals, root_local = op.root % locals;
  const bool column = window_->rank() == root_local, root_side = node_ == root_node;
  const uint64_t bytes = op.count * op.esize;
  const auto start = [&](Message what, char* buf, size_t n, int node) {
    op.transfers.push_back({ColumnLink::kNoRequest, what, std::min(n, kMaxMessage), node});
    ColumnLink::Request* request = &op.transfers.back().request;
    if (what == Message::kSend ? link_->send(buf, n, node, request) : link_->receive(buf, n, node, request))
      return true;
    error_ = "broadcasting over the column link failed: " + link_->error();
    return false;
  };
  if (op.phase == 0 && column) {
    if (op.transfers.empty()) {
      write_header(op.header, op);
      if (root_side) op.acknowledgements.resize(static_cast<size_t>(nodes_) * kHeader);
      for (int n = 0; n < nodes_; ++n) {
        if (n == node_ || (!root_side && n != root_node)) continue;
        if (!start(root_side ? Message::kSend : Message::kHeader, root_side ? op.header : op.received_header, kHeader,
                   n))
          return Progress::kFailed;
        for (uint64_t at = 0; at < bytes; at += kMaxMessage)
          if (!start(root_side ? Message::kSend : Message::kData, op.buf + at,
                     static_cast<size_t>(std::min<uint64_t>(kMaxMessage, bytes - at)), n))
            return Progress::kFailed;
        if (root_side && !start(Message::kAcknowledgement,
                                op.acknowledgements.data() + static_cast<size_t>(n) * kHeader, kHeader, n))
          return Progress::kFailed;
      }
    }
    const Progress p = finish_transfers(op);
    if (p != Progress::kDone) return p;
  }
  if (op.phase == 0) {
    op.local = window_->begin(op.sequence, ZERO_COLL_BROADCAST, op.dtype, op.buf, op.count, op.esize, ZERO_REDUCE_SUM,
                              root_local);
    op.phase = 1;
  }
  if (op.phase == 1) {
    const NodeWindow::Progress p = window_->step(op.local);
    if (p == NodeWindow::Progress::kMismatch) error_ = window_->mismatch();
    if (p == NodeWindow::Progress::kFailed) error_ = window_->failure();
    if (p != NodeWindow::Progress::kDone)
      return p == NodeWindow::Progress::kWaiting    ? Progress::kWaiting
             : p == NodeWindow::Progress::kMismatch ? Progress::kMismatch
                                                    : Progress::kFailed;
    if (!column || root_side) return Progress::kDone;
    op.phase = 2;
    if (!start(Message::kSend, op.header, kHeader, root_node)) return Progress::kFailed;
  }
  return finish_transfers(op);
}

// Tests a broadcast's transfers in order until one is pending; checks what each receive brought.
CrossNode::Progress CrossNode::finish_transfers(Op& op) {
  using Message = Op::Message;
  for (; op.transfers_done < op.transfers.size(); ++op.transfers_done) {
    Op::Transfer& t = op.transfers[op.transfers_done];
    size_t got = 0;
    const ColumnLink::Test test = link_->test(&t.request, &got);
    if (test == ColumnLink::Test::kPending) return Progress::kWaiting;
    if (test != ColumnLink::Test::kDone) {
      error_ = "broadcasting over the column link failed: " + link_->error();
      return test == ColumnLink::Test::kTruncated ? Progress::kMismatch : Progress::kFailed;
    }
    if (t.what == Message::kSend) continue;
    const char* theirs = t.what == Message::kHeader ? op.received_header
                         : t.what == Message::kAcknowledgement
                             ? op.acknowledgements.data() + static_cast<size_t>(t.node) * kHeader
                             : nullptr;
    if (got == t.bytes && (theirs == nullptr || std::memcmp(theirs, op.header, kHeader) == 0)) continue;
    uint64_t words[4] = {};
    if (theirs != nullptr && got == kHeader) std::memcpy(words, theirs, sizeof words);
    const std::string peer = "rank " + std::to_string(t.node * window_->size() + window_->rank());
    const std::string me = "rank " + std::to_string(node_ * window_->size() + window_->rank());
    const std::string what = theirs == nullptr || got != kHeader
                                 ? std::to_string(got) + " bytes"
                                 : "collective #" + std::to_string(words[0]) + " (" + std::to_string(words[2]) +
                                       " elements, kind " + std::to_string(words[3] >> 48) + ", op or root " +
                                       std::to_string(words[3] & 0xffffffffu) + ")";
    error_ = (t.what == Message::kAcknowledgement ? peer + " answered that it is in " : peer + " sent ") + what +
             " where " + me + " is in collective #" + std::to_string(op.sequence) + " (a broadcast of " +
             std::to_string(op.count) + " elements from rank " + std::to_string(op.root) + ")";
    return Progress::kMismatch;
  }
  return Progress::kDone;
}

}  // namespace zero
