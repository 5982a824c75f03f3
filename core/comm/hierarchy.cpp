#include "comm/hierarchy.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <thread>
#include <utility>

#include "comm/rank_order_sum.hpp"
#include "zero/zero.h"

namespace zero {

Hierarchy::Hierarchy(std::shared_ptr<NodeWindow> window, std::unique_ptr<ColumnLink> link, int node, int nodes)
    : window_(std::move(window)), link_(std::move(link)), nodes_(nodes), node_(node) {
  local_ = window_->rank();
  locals_ = window_->size();
  for (int r = 0; r < locals_; ++r) window_names_.push_back(node_ * locals_ + r);
  const size_t half = window_->half_bytes();
  // The largest messages (see step_reduce_scatter): M partial sums of a piece, or one block's piece.
  // Slots start on cache lines (the payloads are read as floats).
  partial_bytes_ = (kHeader + half / static_cast<size_t>(locals_) * 2 + 127) / 64 * 64;
  final_bytes_ = (kHeader + half / static_cast<size_t>(nodes_ * locals_) + 127) / 64 * 64;
  partial_in_.assign(kSlots * partial_bytes_, 0);
  partial_out_.assign(kSlots * partial_bytes_, 0);
  final_out_.assign(kSlots * static_cast<size_t>(nodes_) * final_bytes_, 0);
  final_in_.assign(kSlots * final_bytes_, 0);
  headers_in_.assign(static_cast<size_t>(nodes_) * kHeader, 0);
  header_out_.assign(kHeader, 0);
  partial_in_req_.assign(kSlots, ColumnLink::kNoRequest);
  partial_out_req_.assign(kSlots, ColumnLink::kNoRequest);
  final_out_req_.assign(kSlots * static_cast<size_t>(nodes_), ColumnLink::kNoRequest);
  final_in_req_.assign(kSlots, ColumnLink::kNoRequest);
}

Hierarchy::~Hierarchy() {
  if (link_->idle()) return;
  // Never destroyed: the link (MPI_Finalize, at exit, after static destructors) may still deliver into it.
  static auto* kept = new std::vector<std::vector<char>>();
  for (std::vector<char>* v : {&partial_in_, &partial_out_, &final_out_, &final_in_, &headers_in_, &header_out_})
    kept->push_back(std::move(*v));
}

void Hierarchy::free() {
  window_->free();
  link_->free();
}

Hierarchy::Op Hierarchy::begin(uint64_t sequence, int32_t kind, int32_t dtype, void* buf, uint64_t count, size_t esize,
                               int32_t called, uint32_t detail) const {
  Op op;
  op.sequence = sequence;
  op.kind = kind;
  op.called = called >= 0 ? called : kind;
  op.detail = detail;
  op.dtype = dtype;
  op.buf = static_cast<char*>(buf);
  op.count = count;
  op.esize = esize;
  const size_t half = window_->half_bytes();
  // Reduce-scatter: a chunk's half holds, for each local peer, a piece of each of its M blocks (N pieces).
  // All-gather: the M blocks this rank holds after the exchange. Pieces start on cache lines.
  size_t per = kind == ZERO_COLL_REDUCE_SCATTER ? half / static_cast<size_t>(nodes_ * locals_)
                                                : half / static_cast<size_t>(nodes_);
  per = per / 64 * 64;
  op.piece = std::max<size_t>(1, per / esize);
  op.chunks = (count + op.piece - 1) / op.piece;
  return op;
}

// Tests a request and turns a failure into error()'s message. Sets done. A message longer than its receive comes
// from a rank in another collective: truncated_ says so.
bool Hierarchy::test(Request& r, bool& done, const char* what, size_t* received) {
  size_t got = 0;
  const ColumnLink::Test t = link_->test(&r, &got);
  if (t == ColumnLink::Test::kFailed || t == ColumnLink::Test::kTruncated) {
    truncated_ = t == ColumnLink::Test::kTruncated;
    error_ = std::string(what) + " failed: " + link_->error() +
             (truncated_ ? ": the ranks are not in the same collective" : "");
    return false;
  }
  done = t == ColumnLink::Test::kDone;
  if (received != nullptr) *received = got;
  return true;
}

bool Hierarchy::started(bool ok, const char* what) {
  if (!ok) error_ = std::string(what) + " failed: " + link_->error();
  return ok;
}

size_t Hierarchy::chunk_elems(const Op& op, uint64_t t) const {
  const uint64_t begin = t * op.piece;
  return static_cast<size_t>(std::min<uint64_t>(op.piece, op.count - begin));
}

char* Hierarchy::block(const Op& op, int node, int local, uint64_t offset) const {
  return op.buf +
         ((static_cast<uint64_t>(node) * static_cast<uint64_t>(locals_) + static_cast<uint64_t>(local)) * op.count +
          offset) *
             op.esize;
}

// The header's last word: the collective called, its dtype and its detail (16, 16 and 32 bits).
uint64_t Hierarchy::signature(const Op& op) {
  return (static_cast<uint64_t>(static_cast<uint16_t>(op.called)) << 48) |
         (static_cast<uint64_t>(static_cast<uint16_t>(op.dtype)) << 32) | op.detail;
}

void Hierarchy::write_header(char* m, const Op& op, uint64_t t) {
  const uint64_t words[4] = {op.sequence, t, op.count, signature(op)};
  std::memcpy(m, words, sizeof words);
}

// Whether the message received into `m` (`got` bytes) is chunk t of op, of `bytes` bytes.
bool Hierarchy::header_matches(const char* m, size_t got, size_t bytes, const Op& op, uint64_t t, int from_node,
                               const char* what) {
  uint64_t words[4] = {};
  std::memcpy(words, m, std::min(sizeof words, got));
  if (got == bytes && words[0] == op.sequence && words[1] == t && words[2] == op.count && words[3] == signature(op))
    return true;
  const std::string chunk = t == kExchange ? "its block" : "chunk " + std::to_string(t);
  error_ =
      "rank " + std::to_string(from_node * locals_ + local_) + " sent " + what + " (" + std::to_string(got) + " bytes";
  if (got >= kHeader)
    error_ += ": collective #" + std::to_string(words[0]) + ", kind " + std::to_string(words[3] >> 48) + ", dtype " +
              std::to_string((words[3] >> 32) & 0xffffu) + ", op or root " + std::to_string(words[3] & 0xffffffffu) +
              ", " + std::to_string(words[2]) + " elements per rank";
  error_ += ") where this rank expected " + std::to_string(bytes) + " bytes of collective #" +
            std::to_string(op.sequence) + " (" + chunk + ", kind " + std::to_string(op.called) + ", dtype " +
            std::to_string(op.dtype) + ", op or root " + std::to_string(op.detail) + ", " + std::to_string(op.count) +
            " elements per rank)";
  return false;
}

// On a collective's first chunk, once every local rank has arrived: whether they all wrote this descriptor.
bool Hierarchy::local_peers_agree(Op& op) {
  if (!op.first) return true;
  if (!window_->peers_agree(op.s, &window_names_)) {
    error_ = window_->mismatch();
    return false;
  }
  op.first = false;
  return true;
}

// Reduce-scatter: chunk t's partial sums from node k - 1 are received kSlots chunks ahead; its final block from
// node M - 1 after this rank's fold of it. Progress::kWaiting whenever a peer is behind.
Hierarchy::Progress Hierarchy::step_reduce_scatter(Op& op) {
  const int k = node_, last = nodes_ - 1;
  for (int done = 0;;) {
    // Partial sums from node k - 1, received ahead into free slots (chunk t's slot frees when t is folded).
    while (k > 0 && op.partials_posted < op.chunks && op.partials_posted < op.chunk + kSlots) {
      const uint64_t t = op.partials_posted;
      const size_t bytes = kHeader + static_cast<size_t>(nodes_) * chunk_elems(op, t) * 4;
      if (!started(link_->receive(partial_in(t), bytes, k - 1, &partial_in_req_[t % kSlots]), "receiving partial sums"))
        return Progress::kFailed;
      ++op.partials_posted;
    }
    // Final blocks from node M - 1, in order, into the caller's buffer.
    while (k < last && op.finals_done < op.finals_posted) {
      const uint64_t t = op.finals_done;
      bool arrived = false;
      size_t got = 0;
      if (!test(final_in_req_[t % kSlots], arrived, "receiving a reduced block", &got)) return test_failure();
      if (!arrived) break;
      if (!header_matches(final_in(t), got, kHeader + chunk_elems(op, t) * op.esize, op, t, last, "a reduced block"))
        return Progress::kMismatch;
      std::memcpy(block(op, k, local_, t * op.piece), final_in(t) + kHeader, chunk_elems(op, t) * op.esize);
      ++op.finals_done;
    }
    if (op.chunk == op.chunks) break;
    if (done == kChunksPerCall) return Progress::kWaiting;
    const uint64_t t = op.chunk;
    const uint64_t offset = t * op.piece;
    const size_t m = chunk_elems(op, t), piece_bytes = m * op.esize;
    if (op.phase == kCopy) {
      op.s = window_->next_chunk();
      if (!window_->all_arrived(op.s)) return Progress::kWaiting;
      // For each local peer, its column's M blocks: slot (peer, n) of this rank's half.
      char* half = window_->half(local_, op.s);
      for (int peer = 0; peer < locals_; ++peer)
        if (peer != local_)
          for (int n = 0; n < nodes_; ++n)
            std::memcpy(
                half + (static_cast<size_t>(peer) * static_cast<size_t>(nodes_) + static_cast<size_t>(n)) * piece_bytes,
                block(op, n, peer, offset), piece_bytes);
      if (op.first) window_->write_descriptor(op.s, op.sequence, op.called, op.dtype, op.count, op.detail);
      window_->arrive(op.s);
      op.phase = kPeers;
    }
    if (op.phase == kPeers) {
      if (!window_->all_arrived(op.s + 1)) return Progress::kWaiting;
      if (!local_peers_agree(op)) return Progress::kMismatch;
      op.phase = kFold;
    }
    // The fold needs free message slots and node k - 1's partial sums. (Testing a send that completed again is
    // harmless; a receive is tested until it arrives, once: see Op::partial_ready.)
    if (k < last) {
      bool sent = false;
      if (!test(partial_out_req_[t % kSlots], sent, "sending partial sums")) return test_failure();
      if (!sent || op.finals_done + kSlots <= t) return Progress::kWaiting;
    } else {
      for (int n = 0; n < nodes_; ++n) {
        bool sent = false;
        if (!test(final_out_req_[(t % kSlots) * static_cast<size_t>(nodes_) + static_cast<size_t>(n)], sent,
                  "sending a reduced block"))
          return test_failure();
        if (!sent) return Progress::kWaiting;
      }
    }
    if (k > 0 && !op.partial_ready) {
      bool arrived = false;
      size_t got = 0;
      if (!test(partial_in_req_[t % kSlots], arrived, "receiving partial sums", &got)) return test_failure();
      if (!arrived) return Progress::kWaiting;
      if (!header_matches(partial_in(t), got, kHeader + static_cast<size_t>(nodes_) * m * 4, op, t, k - 1,
                          "partial sums"))
        return Progress::kMismatch;
      op.partial_ready = true;
    }
    if (k == last && slow_last_node_us_ > 0) std::this_thread::sleep_for(std::chrono::microseconds(slow_last_node_us_));
    // Block nL + local_ for every node n: the node's ranks in order, after node k - 1's sum.
    const float* prefix = k > 0 ? reinterpret_cast<const float*>(partial_in(t) + kHeader) : nullptr;
    float* partials = reinterpret_cast<float*>(partial_out(t) + kHeader);
    sources_.resize(static_cast<size_t>(locals_));
    for (int n = 0; n < nodes_; ++n) {
      for (int peer = 0; peer < locals_; ++peer)
        sources_[static_cast<size_t>(peer)] =
            peer == local_ ? block(op, n, local_, offset)
                           : window_->half(peer, op.s) +
                                 (static_cast<size_t>(local_) * static_cast<size_t>(nodes_) + static_cast<size_t>(n)) *
                                     piece_bytes;
      const float* from = prefix != nullptr ? prefix + static_cast<size_t>(n) * m : nullptr;
      void* to = k < last ? static_cast<void*>(partials + static_cast<size_t>(n) * m)
                 : n == k ? static_cast<void*>(block(op, n, local_, offset))
                          : static_cast<void*>(final_out(t, n) + kHeader);
      sum_in_rank_order_from(to, k < last, from, sources_.data(), locals_, m, op.dtype);
    }
    window_->finish_chunk(op.s);  // the peers' halves are read
    if (k < last) {
      write_header(partial_out(t), op, t);
      const size_t bytes = kHeader + static_cast<size_t>(nodes_) * m * 4;
      if (!started(link_->send(partial_out(t), bytes, k + 1, &partial_out_req_[t % kSlots]), "sending partial sums"))
        return Progress::kFailed;
      if (!started(link_->receive(final_in(t), kHeader + piece_bytes, last, &final_in_req_[t % kSlots]),
                   "receiving a reduced block"))
        return Progress::kFailed;
      ++op.finals_posted;
    } else {
      for (int n = 0; n < last; ++n) {
        write_header(final_out(t, n), op, t);
        if (!started(link_->send(final_out(t, n), kHeader + piece_bytes, n,
                                 &final_out_req_[(t % kSlots) * static_cast<size_t>(nodes_) + static_cast<size_t>(n)]),
                     "sending a reduced block"))
          return Progress::kFailed;
      }
    }
    op.phase = kCopy;
    op.partial_ready = false;
    ++op.chunk;
    ++done;
  }
  // Every chunk folded: done when this rank's block is complete and every message it sent has left.
  if (op.finals_done < op.finals_posted) return Progress::kWaiting;
  for (std::vector<Request>* v : {&partial_out_req_, &final_out_req_})
    for (Request& r : *v) {
      bool sent = false;
      if (!test(r, sent, "sending a message")) return test_failure();
      if (!sent) return Progress::kWaiting;
    }
  return Progress::kDone;
}

// All-gather: the column exchange (every message straight between the caller's buffers), then the window.
Hierarchy::Progress Hierarchy::step_all_gather(Op& op) {
  const uint64_t block_bytes = op.count * op.esize;
  if (!op.exchange_started) {
    op.exchange_started = true;
    exchange_req_.clear();
    exchange_what_.clear();
    write_header(header_out_.data(), op, kExchange);
    for (int n = 0; n < nodes_; ++n) {
      if (n == node_) continue;
      // The header first, then the block in pieces: one sender's messages arrive in order.
      exchange_req_.push_back(ColumnLink::kNoRequest);
      exchange_what_.push_back({n, -1});
      if (!started(
              link_->receive(headers_in_.data() + static_cast<size_t>(n) * kHeader, kHeader, n, &exchange_req_.back()),
              "receiving a block's header"))
        return Progress::kFailed;
      exchange_req_.push_back(ColumnLink::kNoRequest);
      exchange_what_.push_back({n, -2});
      if (!started(link_->send(header_out_.data(), kHeader, n, &exchange_req_.back()), "sending a block's header"))
        return Progress::kFailed;
      for (uint64_t at = 0; at < block_bytes; at += kMaxMessage) {
        const int bytes = static_cast<int>(std::min<uint64_t>(kMaxMessage, block_bytes - at));
        exchange_req_.push_back(ColumnLink::kNoRequest);
        exchange_what_.push_back({n, bytes});
        if (!started(link_->receive(block(op, n, local_, 0) + at, static_cast<size_t>(bytes), n, &exchange_req_.back()),
                     "receiving a block"))
          return Progress::kFailed;
        exchange_req_.push_back(ColumnLink::kNoRequest);
        exchange_what_.push_back({n, -2});
        if (!started(
                link_->send(block(op, node_, local_, 0) + at, static_cast<size_t>(bytes), n, &exchange_req_.back()),
                "sending a block"))
          return Progress::kFailed;
      }
    }
  }
  if (!op.exchanged) {
    for (size_t i = 0; i < exchange_req_.size(); ++i) {
      if (exchange_req_[i] == ColumnLink::kNoRequest) continue;
      bool done = false;
      size_t got = 0;
      if (!test(exchange_req_[i], done, "exchanging a block", &got)) return test_failure();
      if (!done) return Progress::kWaiting;
      const Exchange& what = exchange_what_[i];
      if (what.bytes == -1) {
        if (!header_matches(headers_in_.data() + static_cast<size_t>(what.node) * kHeader, got, kHeader, op, kExchange,
                            what.node, "a block's header"))
          return Progress::kMismatch;
      } else if (what.bytes >= 0 && got != static_cast<size_t>(what.bytes)) {
        error_ = "rank " + std::to_string(what.node * locals_ + local_) + " sent " + std::to_string(got) +
                 " bytes of a block where this rank expected " + std::to_string(what.bytes) + " (collective #" +
                 std::to_string(op.sequence) + ")";
        return Progress::kMismatch;
      }
    }
    op.exchanged = true;
  }
  for (int done = 0; op.chunk < op.chunks; ++done) {
    if (done == kChunksPerCall) return Progress::kWaiting;
    const uint64_t offset = op.chunk * op.piece;
    const size_t piece_bytes = chunk_elems(op, op.chunk) * op.esize;
    if (op.phase == kCopy) {
      op.s = window_->next_chunk();
      if (!window_->all_arrived(op.s)) return Progress::kWaiting;
      char* half = window_->half(local_, op.s);
      for (int n = 0; n < nodes_; ++n)
        std::memcpy(half + static_cast<size_t>(n) * piece_bytes, block(op, n, local_, offset), piece_bytes);
      if (op.first) window_->write_descriptor(op.s, op.sequence, op.called, op.dtype, op.count, op.detail);
      window_->arrive(op.s);
      op.phase = kPeers;
    }
    if (!window_->all_arrived(op.s + 1)) return Progress::kWaiting;
    if (!local_peers_agree(op)) return Progress::kMismatch;
    for (int peer = 0; peer < locals_; ++peer)
      if (peer != local_)
        for (int n = 0; n < nodes_; ++n)
          std::memcpy(block(op, n, peer, offset), window_->half(peer, op.s) + static_cast<size_t>(n) * piece_bytes,
                      piece_bytes);
    window_->finish_chunk(op.s);
    op.phase = kCopy;
    ++op.chunk;
  }
  return Progress::kDone;
}

}  // namespace zero
