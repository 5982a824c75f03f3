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

void CrossNode::answer_with(std::function<Machine(uint64_t sequence)> describe) {
  link_->answer_questions_with([describe = std::move(describe)](const std::string& question) {
    const Machine m = describe(std::strtoull(question.c_str(), nullptr, 10));
    return std::string(m.settled ? "1" : "0") + m.lines;
  });
}

CrossNode::Machine CrossNode::machine(int node) const {
  Machine m;
  const std::string answer = link_->answer(node);
  if (answer.empty()) return m;
  m.answered = true;
  m.settled = answer[0] == '1';
  m.lines = answer.substr(1);
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
    return "rank " + std::to_string(n * window_->size() + window_->rank()) +
           " has stopped: " + notice.substr(space + 1) + ". It took part in the collectives up to #" +
           std::to_string(after) + ", so collective #" + std::to_string(sequence) + " (" + label + ") cannot complete";
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

// The root's column first: its rank on each other node receives the root's buffer (a header, then the data in
// pieces); then every node's window broadcasts from that rank.
CrossNode::Progress CrossNode::step_broadcast(Op& op) {
  const int locals = window_->size();
  const int root_node = op.root / locals, root_local = op.root % locals;
  const uint64_t bytes = op.count * op.esize;
  if (op.phase == 0) {
    if (window_->rank() == root_local && op.requests.empty()) {
      write_header(op.header, op);
      const auto start = [&](bool send, char* buf, size_t n, int node) {
        op.requests.push_back(ColumnLink::kNoRequest);
        op.received.push_back(send ? -1 : static_cast<int>(std::min<size_t>(n, kMaxMessage)));
        return send ? link_->send(buf, n, node, &op.requests.back())
                    : link_->receive(buf, n, node, &op.requests.back());
      };
      bool ok = true;
      for (int n = 0; n < nodes_ && ok; ++n) {
        if (node_ == root_node && n == node_) continue;
        if (node_ != root_node && n != root_node) continue;
        const bool send = node_ == root_node;
        ok = start(send, op.header, kHeader, n);
        for (uint64_t at = 0; at < bytes && ok; at += kMaxMessage)
          ok = start(send, op.buf + at, static_cast<size_t>(std::min<uint64_t>(kMaxMessage, bytes - at)), n);
      }
      if (!ok) {
        error_ = "broadcasting over the column link failed: " + link_->error();
        return Progress::kFailed;
      }
      // Nothing to do over the link: a requests list that stays empty is marked by one done request.
      if (op.requests.empty()) op.requests.push_back(ColumnLink::kNoRequest);
    }
    if (window_->rank() == root_local) {
      for (size_t i = 0; i < op.requests.size(); ++i) {
        size_t got = 0;
        if (op.requests[i] == ColumnLink::kNoRequest) continue;
        const ColumnLink::Test t = link_->test(&op.requests[i], &got);
        if (t == ColumnLink::Test::kPending) return Progress::kWaiting;
        if (t != ColumnLink::Test::kDone) {
          error_ = "broadcasting over the column link failed: " + link_->error();
          return t == ColumnLink::Test::kTruncated ? Progress::kMismatch : Progress::kFailed;
        }
        const int expected = op.received[i];
        const bool header = i == 0 && node_ != root_node;
        char mine[kHeader];
        write_header(mine, op);
        if (expected >= 0 &&
            (got != static_cast<size_t>(expected) || (header && std::memcmp(mine, op.header, kHeader) != 0))) {
          uint64_t theirs[4] = {};
          std::memcpy(theirs, op.header, sizeof theirs);
          error_ = "rank " + std::to_string(op.root) + "'s column sent " +
                   (header ? "collective #" + std::to_string(theirs[0]) + " (" + std::to_string(theirs[2]) +
                                 " elements, kind " + std::to_string(theirs[3] >> 48) + ", op or root " +
                                 std::to_string(theirs[3] & 0xffffffffu) + ")"
                           : std::to_string(got) + " bytes") +
                   " where this rank is in collective #" + std::to_string(op.sequence) + " (a broadcast of " +
                   std::to_string(op.count) + " elements from rank " + std::to_string(op.root) + ")";
          return Progress::kMismatch;
        }
      }
    }
    op.local = window_->begin(op.sequence, ZERO_COLL_BROADCAST, op.dtype, op.buf, op.count, op.esize, ZERO_REDUCE_SUM,
                              root_local);
    op.phase = 1;
  }
  const NodeWindow::Progress p = window_->step(op.local);
  if (p == NodeWindow::Progress::kMismatch) error_ = window_->mismatch();
  if (p == NodeWindow::Progress::kFailed) error_ = window_->failure();
  return p == NodeWindow::Progress::kWaiting    ? Progress::kWaiting
         : p == NodeWindow::Progress::kDone     ? Progress::kDone
         : p == NodeWindow::Progress::kMismatch ? Progress::kMismatch
                                                : Progress::kFailed;
}

}  // namespace zero
