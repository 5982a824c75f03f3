// Reduce-scatters and all-gathers across nodes: each node's ranks share one window (node_window.hpp's chunk
// protocol), and ranks with the same place on different nodes talk over MPI — with the bits of the one-node paths.
//
// Layout: N = M nodes x L ranks, node k holding the consecutive ranks kL .. kL + L - 1 (mpirun's and torchrun's
// default placement; the backend uses this path only then). Rank (k, l) is local rank l of node k; the ranks
// (0, l) .. (M - 1, l) form a "column" communicator of their own, in which (k, l) is rank k.
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
// All-gather. (k, l) first exchanges its own block with the other nodes' (n, l) over MPI, a header and then the
// block straight into the caller's buffer; then the node's window gives every local rank the M blocks each of its peers
// holds.
//
// Inter-node traffic per rank: a reduce-scatter sends M x count fp32 partial sums and, from the last node, M - 1
// blocks; an all-gather M - 1 blocks — where the one-node-at-a-time all-to-all sends N - L raw blocks. MPI calls:
// this class makes them, so only the thread inside the backend's waits may step it (the backend runs no progress
// thread with it).
//
// Staging: one set of message buffers (kSlots chunks ahead in each direction), owned here and used by one
// collective at a time (the backend moves its collectives strictly in start order). Never allocated per call.
#pragma once

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "comm/rank_order_sum.hpp"
#include "node_window.hpp"
#include "zero/zero.h"

namespace zero_mpi {

class Hierarchy {
 public:
  // Collective over `data`. `node`: this rank's node, whose ranks are the consecutive data ranks kL .. kL + L - 1
  // (the caller checked, for every rank). Null, on every rank, where some node's window cannot be made or the
  // chunk buffer is too small for N ranks (the caller then uses MPI's collectives).
  static std::unique_ptr<Hierarchy> create(MPI_Comm data, MPI_Comm node, size_t half_bytes) {
    int rank = 0, size = 0, local = 0, local_size = 0;
    MPI_Comm_rank(data, &rank);
    MPI_Comm_size(data, &size);
    MPI_Comm_rank(node, &local);
    MPI_Comm_size(node, &local_size);
    // Every rank cuts a collective into the same chunks (the nodes exchange them by number): one chunk buffer size
    // for the whole job, the smallest any rank asked for.
    unsigned long long agreed = half_bytes / 64 * 64;
    MPI_Allreduce(MPI_IN_PLACE, &agreed, 1, MPI_UNSIGNED_LONG_LONG, MPI_MIN, data);
    // A reduce-scatter's chunk holds a piece of every block: each must hold at least a cache line.
    if (agreed < 64 * static_cast<unsigned long long>(size)) return nullptr;
    std::unique_ptr<NodeWindow> window = make_node_window(node, static_cast<size_t>(agreed), false);
    int ok = window != nullptr ? 1 : 0;
    MPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_INT, MPI_MIN, data);
    if (!ok) {
      if (window) window->free();  // every rank of this node made it: MPI_Win_free is collective over the node
      return nullptr;
    }
    auto h = std::unique_ptr<Hierarchy>(new Hierarchy());
    h->window_ = std::move(window);
    h->rank_ = rank;
    h->local_ = local;
    h->locals_ = local_size;
    h->nodes_ = size / local_size;
    h->node_ = rank / local_size;
    MPI_Comm_split(data, local, rank, &h->column_);
    MPI_Comm_set_errhandler(h->column_, MPI_ERRORS_RETURN);
    for (int r = 0; r < local_size; ++r) h->window_names_.push_back(h->node_ * local_size + r);
    const size_t half = h->window_->half_bytes();
    // The largest messages (see step_reduce_scatter): M partial sums of a piece, or one block's piece.
    // Slots start on cache lines (the payloads are read as floats).
    h->partial_bytes_ = (kHeader + half / static_cast<size_t>(local_size) * 2 + 127) / 64 * 64;
    h->final_bytes_ = (kHeader + half / static_cast<size_t>(size) + 127) / 64 * 64;
    h->partial_in_.assign(kSlots * h->partial_bytes_, 0);
    h->partial_out_.assign(kSlots * h->partial_bytes_, 0);
    h->final_out_.assign(kSlots * static_cast<size_t>(h->nodes_) * h->final_bytes_, 0);
    h->final_in_.assign(kSlots * h->final_bytes_, 0);
    h->headers_in_.assign(static_cast<size_t>(h->nodes_) * kHeader, 0);
    h->header_out_.assign(kHeader, 0);
    h->partial_in_req_.assign(kSlots, MPI_REQUEST_NULL);
    h->partial_out_req_.assign(kSlots, MPI_REQUEST_NULL);
    h->final_out_req_.assign(kSlots * static_cast<size_t>(h->nodes_), MPI_REQUEST_NULL);
    h->final_in_req_.assign(kSlots, MPI_REQUEST_NULL);
#ifdef ZERO_TEST_HOOKS
    // The last node folds each chunk this much later, so that the nodes before it wait for their reduced blocks
    // with their next partial sums already arrived (the state a retest of a completed receive went wrong in).
    if (const char* slow = std::getenv("ZERO_TEST_MPI_SLOW_LAST_NODE_US"); slow != nullptr)
      h->slow_last_node_us_ = std::atoi(slow);
#endif
    return h;
  }

  // Requests still in flight (a collective given up) may still write into the staging: then it is kept for the
  // life of the process, reachable from a registry (so that LeakSanitizer does not call it lost), never freed.
  ~Hierarchy() {
    if (idle()) return;
    // Never destroyed: MPI_Finalize (at exit, after static destructors) may still deliver into it.
    static auto* kept = new std::vector<std::vector<char>>();
    for (std::vector<char>* v : {&partial_in_, &partial_out_, &final_out_, &final_in_, &headers_in_, &header_out_})
      kept->push_back(std::move(*v));
  }

  // Collective (zero_comm_finalize).
  void free() {
    window_->free();
    if (column_ != MPI_COMM_NULL) MPI_Comm_free(&column_);
  }

  int nodes() const { return nodes_; }
  int locals() const { return locals_; }

  enum class Progress { kWaiting, kDone, kMismatch, kFailed };

  struct Op {
    uint64_t sequence = 0;
    int32_t kind = 0;  // ZERO_COLL_REDUCE_SCATTER or ZERO_COLL_ALL_GATHER
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
    // The chunk's partial sums from node k - 1 have arrived and been checked. Their receive's request is null
    // from then on, and MPI_Test of a null request reports an empty message: it must not be tested again when the
    // fold waits for something else.
    bool partial_ready = false;
    // All-gather: the exchange over the column, started and completed.
    bool exchange_started = false, exchanged = false;
  };

  Op begin(uint64_t sequence, int32_t kind, int32_t dtype, void* buf, uint64_t count, size_t esize) const {
    Op op;
    op.sequence = sequence;
    op.kind = kind;
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

  // Advances `op` as far as the peers allow (a bounded amount of work per call). kMismatch / kFailed: error()
  // says why; the communicator is unusable afterwards.
  Progress step(Op& op) { return op.kind == ZERO_COLL_REDUCE_SCATTER ? step_reduce_scatter(op) : step_all_gather(op); }

  const std::string& error() const { return error_; }

 private:
  static constexpr size_t kSlots = 4;  // chunks in flight ahead per direction
  // Every message starts with (or, for an all-gather's blocks, is preceded by) a header: the collective's number,
  // the chunk's (kExchange for an all-gather's), the count and the kind and dtype — checked on arrival with the
  // message's size, so ranks in different collectives fail instead of summing or copying each other's data. One
  // tag for all of them: a rank in another kind of collective sends a message the receive does not expect, which
  // fails its check rather than waiting for a message that never comes.
  static constexpr size_t kHeader = 32;
  static constexpr uint64_t kExchange = UINT64_MAX;
  static constexpr int kChunksPerCall = 64;  // as node_window.hpp's
  static constexpr int kTag = 1;
  static constexpr size_t kMaxMessage = size_t{1} << 30;  // an all-gather's block goes in pieces of at most this
  enum Phase { kCopy = 0, kPeers = 1, kFold = 2 };

  Hierarchy() = default;

  bool idle() const {
    for (const std::vector<MPI_Request>* v :
         {&partial_in_req_, &partial_out_req_, &final_out_req_, &final_in_req_, &exchange_req_})
      for (MPI_Request r : *v)
        if (r != MPI_REQUEST_NULL) return false;
    return true;
  }

  // MPI_Test that turns an MPI error into error()'s message. Sets done. A message longer than its receive
  // (MPI_ERR_TRUNCATE) comes from a rank in another collective: truncated_ says so.
  bool test(MPI_Request& r, bool& done, const char* what, MPI_Status* status = MPI_STATUS_IGNORE) {
    int flag = 0;
    const int rc = MPI_Test(&r, &flag, status);
    if (rc != MPI_SUCCESS) {
      int cls = 0;
      truncated_ = MPI_Error_class(rc, &cls) == MPI_SUCCESS && cls == MPI_ERR_TRUNCATE;
      char text[MPI_MAX_ERROR_STRING];
      int len = 0;
      MPI_Error_string(rc, text, &len);
      error_ = std::string(what) + " failed: " + std::string(text, static_cast<size_t>(len)) +
               (truncated_ ? ": the ranks are not in the same collective" : "");
      return false;
    }
    done = flag != 0;
    return true;
  }
  Progress test_failure() const { return truncated_ ? Progress::kMismatch : Progress::kFailed; }
  bool failed(int rc, const char* what) {
    if (rc == MPI_SUCCESS) return false;
    char text[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, text, &len);
    error_ = std::string(what) + " failed: " + std::string(text, static_cast<size_t>(len));
    return true;
  }

  size_t chunk_elems(const Op& op, uint64_t t) const {
    const uint64_t begin = t * op.piece;
    return static_cast<size_t>(std::min<uint64_t>(op.piece, op.count - begin));
  }
  char* block(const Op& op, int node, int local, uint64_t offset) const {
    return op.buf +
           ((static_cast<uint64_t>(node) * static_cast<uint64_t>(locals_) + static_cast<uint64_t>(local)) * op.count +
            offset) *
               op.esize;
  }
  char* partial_in(uint64_t t) { return partial_in_.data() + (t % kSlots) * partial_bytes_; }
  char* partial_out(uint64_t t) { return partial_out_.data() + (t % kSlots) * partial_bytes_; }
  char* final_in(uint64_t t) { return final_in_.data() + (t % kSlots) * final_bytes_; }
  char* final_out(uint64_t t, int node) {
    return final_out_.data() + ((t % kSlots) * static_cast<size_t>(nodes_) + static_cast<size_t>(node)) * final_bytes_;
  }
  static void write_header(char* m, const Op& op, uint64_t t) {
    const uint64_t words[4] = {
        op.sequence, t, op.count,
        (static_cast<uint64_t>(static_cast<uint32_t>(op.kind)) << 32) | static_cast<uint32_t>(op.dtype)};
    std::memcpy(m, words, sizeof words);
  }
  // Whether the message received into `m` (status: its receive's) is chunk t of op, of `bytes` bytes.
  bool header_matches(const char* m, MPI_Status& status, size_t bytes, const Op& op, uint64_t t, int from_node,
                      const char* what) {
    uint64_t words[4];
    std::memcpy(words, m, sizeof words);
    int got = 0;
    const bool size_ok = MPI_Get_count(&status, MPI_BYTE, &got) == MPI_SUCCESS && static_cast<size_t>(got) == bytes;
    const uint64_t kind_dtype =
        (static_cast<uint64_t>(static_cast<uint32_t>(op.kind)) << 32) | static_cast<uint32_t>(op.dtype);
    if (size_ok && words[0] == op.sequence && words[1] == t && words[2] == op.count && words[3] == kind_dtype)
      return true;
    const std::string chunk = t == kExchange ? "its block" : "chunk " + std::to_string(t);
    error_ = "rank " + std::to_string(from_node * locals_ + local_) + " sent " + what + " (" + std::to_string(got) +
             " bytes";
    if (static_cast<size_t>(got) >= kHeader)
      error_ += ": collective #" + std::to_string(words[0]) + ", kind " + std::to_string(words[3] >> 32) + ", dtype " +
                std::to_string(words[3] & 0xffffffffu) + ", " + std::to_string(words[2]) + " elements per rank";
    error_ += ") where this rank expected " + std::to_string(bytes) + " bytes of collective #" +
              std::to_string(op.sequence) + " (" + chunk + ", kind " + std::to_string(op.kind) + ", dtype " +
              std::to_string(op.dtype) + ", " + std::to_string(op.count) + " elements per rank)";
    return false;
  }

  // On a collective's first chunk, once every local rank has arrived: whether they all wrote this descriptor.
  bool local_peers_agree(Op& op) {
    if (!op.first) return true;
    if (!window_->peers_agree(op.s, &window_names_)) {
      error_ = window_->mismatch();
      return false;
    }
    op.first = false;
    return true;
  }

  // Reduce-scatter: chunk t's partial sums from node k - 1 are posted kSlots chunks ahead; its final block from
  // node M - 1 after this rank's fold of it. Progress::kWaiting whenever a peer is behind.
  Progress step_reduce_scatter(Op& op) {
    const int k = node_, last = nodes_ - 1;
    for (int done = 0;;) {
      // Partial sums from node k - 1, received ahead into free slots (chunk t's slot frees when t is folded).
      while (k > 0 && op.partials_posted < op.chunks && op.partials_posted < op.chunk + kSlots) {
        const uint64_t t = op.partials_posted;
        const size_t bytes = kHeader + static_cast<size_t>(nodes_) * chunk_elems(op, t) * 4;
        if (failed(MPI_Irecv(partial_in(t), static_cast<int>(bytes), MPI_BYTE, k - 1, kTag, column_,
                             &partial_in_req_[t % kSlots]),
                   "MPI_Irecv (partial sums)"))
          return Progress::kFailed;
        ++op.partials_posted;
      }
      // Final blocks from node M - 1, in order, into the caller's buffer.
      while (k < last && op.finals_done < op.finals_posted) {
        const uint64_t t = op.finals_done;
        bool arrived = false;
        MPI_Status status;
        if (!test(final_in_req_[t % kSlots], arrived, "MPI_Test (a reduced block)", &status)) return test_failure();
        if (!arrived) break;
        if (!header_matches(final_in(t), status, kHeader + chunk_elems(op, t) * op.esize, op, t, last,
                            "a reduced block"))
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
              std::memcpy(half + (static_cast<size_t>(peer) * static_cast<size_t>(nodes_) + static_cast<size_t>(n)) *
                                     piece_bytes,
                          block(op, n, peer, offset), piece_bytes);
        if (op.first) window_->write_descriptor(op.s, op.sequence, op.kind, op.dtype, op.count);
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
        if (!test(partial_out_req_[t % kSlots], sent, "MPI_Test (partial sums sent)")) return Progress::kFailed;
        if (!sent || op.finals_done + kSlots <= t) return Progress::kWaiting;
      } else {
        for (int n = 0; n < nodes_; ++n) {
          bool sent = false;
          if (!test(final_out_req_[(t % kSlots) * static_cast<size_t>(nodes_) + static_cast<size_t>(n)], sent,
                    "MPI_Test (a reduced block sent)"))
            return Progress::kFailed;
          if (!sent) return Progress::kWaiting;
        }
      }
      if (k > 0 && !op.partial_ready) {
        bool arrived = false;
        MPI_Status status;
        if (!test(partial_in_req_[t % kSlots], arrived, "MPI_Test (partial sums)", &status)) return test_failure();
        if (!arrived) return Progress::kWaiting;
        if (!header_matches(partial_in(t), status, kHeader + static_cast<size_t>(nodes_) * m * 4, op, t, k - 1,
                            "partial sums"))
          return Progress::kMismatch;
        op.partial_ready = true;
      }
      if (k == last && slow_last_node_us_ > 0)
        std::this_thread::sleep_for(std::chrono::microseconds(slow_last_node_us_));
      // Block nL + local_ for every node n: the node's ranks in order, after node k - 1's sum.
      const float* prefix = k > 0 ? reinterpret_cast<const float*>(partial_in(t) + kHeader) : nullptr;
      float* partials = reinterpret_cast<float*>(partial_out(t) + kHeader);
      sources_.resize(static_cast<size_t>(locals_));
      for (int n = 0; n < nodes_; ++n) {
        for (int peer = 0; peer < locals_; ++peer)
          sources_[static_cast<size_t>(peer)] =
              peer == local_ ? block(op, n, local_, offset)
                             : window_->half(peer, op.s) + (static_cast<size_t>(local_) * static_cast<size_t>(nodes_) +
                                                            static_cast<size_t>(n)) *
                                                               piece_bytes;
        const float* from = prefix != nullptr ? prefix + static_cast<size_t>(n) * m : nullptr;
        void* to = k < last ? static_cast<void*>(partials + static_cast<size_t>(n) * m)
                   : n == k ? static_cast<void*>(block(op, n, local_, offset))
                            : static_cast<void*>(final_out(t, n) + kHeader);
        zero::sum_in_rank_order_from(to, k < last, from, sources_.data(), locals_, m, op.dtype);
      }
      window_->finish_chunk(op.s);  // the peers' halves are read
      if (k < last) {
        write_header(partial_out(t), op, t);
        const size_t bytes = kHeader + static_cast<size_t>(nodes_) * m * 4;
        if (failed(MPI_Isend(partial_out(t), static_cast<int>(bytes), MPI_BYTE, k + 1, kTag, column_,
                             &partial_out_req_[t % kSlots]),
                   "MPI_Isend (partial sums)"))
          return Progress::kFailed;
        if (failed(MPI_Irecv(final_in(t), static_cast<int>(kHeader + piece_bytes), MPI_BYTE, last, kTag, column_,
                             &final_in_req_[t % kSlots]),
                   "MPI_Irecv (a reduced block)"))
          return Progress::kFailed;
        ++op.finals_posted;
      } else {
        for (int n = 0; n < last; ++n) {
          write_header(final_out(t, n), op, t);
          if (failed(MPI_Isend(final_out(t, n), static_cast<int>(kHeader + piece_bytes), MPI_BYTE, n, kTag, column_,
                               &final_out_req_[(t % kSlots) * static_cast<size_t>(nodes_) + static_cast<size_t>(n)]),
                     "MPI_Isend (a reduced block)"))
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
    for (std::vector<MPI_Request>* v : {&partial_out_req_, &final_out_req_})
      for (MPI_Request& r : *v) {
        bool sent = false;
        if (!test(r, sent, "MPI_Test (a message sent)")) return Progress::kFailed;
        if (!sent) return Progress::kWaiting;
      }
    return Progress::kDone;
  }

  // All-gather: the column exchange (every message straight between the caller's buffers), then the window.
  Progress step_all_gather(Op& op) {
    const uint64_t block_bytes = op.count * op.esize;
    if (!op.exchange_started) {
      op.exchange_started = true;
      exchange_req_.clear();
      exchange_what_.clear();
      write_header(header_out_.data(), op, kExchange);
      for (int n = 0; n < nodes_; ++n) {
        if (n == node_) continue;
        // The header first, then the block in pieces: one sender's messages on one tag arrive in order.
        exchange_req_.push_back(MPI_REQUEST_NULL);
        exchange_what_.push_back({n, -1});
        if (failed(MPI_Irecv(headers_in_.data() + static_cast<size_t>(n) * kHeader, static_cast<int>(kHeader), MPI_BYTE,
                             n, kTag, column_, &exchange_req_.back()),
                   "MPI_Irecv (a block's header)"))
          return Progress::kFailed;
        exchange_req_.push_back(MPI_REQUEST_NULL);
        exchange_what_.push_back({n, -2});
        if (failed(MPI_Isend(header_out_.data(), static_cast<int>(kHeader), MPI_BYTE, n, kTag, column_,
                             &exchange_req_.back()),
                   "MPI_Isend (a block's header)"))
          return Progress::kFailed;
        for (uint64_t at = 0; at < block_bytes; at += kMaxMessage) {
          const int bytes = static_cast<int>(std::min<uint64_t>(kMaxMessage, block_bytes - at));
          exchange_req_.push_back(MPI_REQUEST_NULL);
          exchange_what_.push_back({n, bytes});
          if (failed(MPI_Irecv(block(op, n, local_, 0) + at, bytes, MPI_BYTE, n, kTag, column_, &exchange_req_.back()),
                     "MPI_Irecv (a block)"))
            return Progress::kFailed;
          exchange_req_.push_back(MPI_REQUEST_NULL);
          exchange_what_.push_back({n, -2});
          if (failed(
                  MPI_Isend(block(op, node_, local_, 0) + at, bytes, MPI_BYTE, n, kTag, column_, &exchange_req_.back()),
                  "MPI_Isend (a block)"))
            return Progress::kFailed;
        }
      }
    }
    if (!op.exchanged) {
      for (size_t i = 0; i < exchange_req_.size(); ++i) {
        if (exchange_req_[i] == MPI_REQUEST_NULL) continue;
        bool done = false;
        MPI_Status status;
        if (!test(exchange_req_[i], done, "MPI_Test (a block)", &status)) return test_failure();
        if (!done) return Progress::kWaiting;
        const Exchange& what = exchange_what_[i];
        if (what.bytes == -1) {
          if (!header_matches(headers_in_.data() + static_cast<size_t>(what.node) * kHeader, status, kHeader, op,
                              kExchange, what.node, "a block's header"))
            return Progress::kMismatch;
        } else if (what.bytes >= 0) {
          int got = 0;
          if (MPI_Get_count(&status, MPI_BYTE, &got) != MPI_SUCCESS || got != what.bytes) {
            error_ = "rank " + std::to_string(what.node * locals_ + local_) + " sent " + std::to_string(got) +
                     " bytes of a block where this rank expected " + std::to_string(what.bytes) + " (collective #" +
                     std::to_string(op.sequence) + ")";
            return Progress::kMismatch;
          }
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
        if (op.first) window_->write_descriptor(op.s, op.sequence, op.kind, op.dtype, op.count);
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

  std::unique_ptr<NodeWindow> window_;
  MPI_Comm column_ = MPI_COMM_NULL;
  int rank_ = 0, local_ = 0, locals_ = 1, nodes_ = 1, node_ = 0;
  std::vector<int> window_names_;  // the data ranks of this node's window ranks
  size_t partial_bytes_ = 0, final_bytes_ = 0;
  std::vector<char> partial_in_, partial_out_, final_out_, final_in_;
  std::vector<MPI_Request> partial_in_req_, partial_out_req_, final_out_req_, final_in_req_, exchange_req_;
  struct Exchange {
    int node;   // the peer's node
    int bytes;  // a block's piece received: its size; -1: a header received; -2: a send
  };
  std::vector<Exchange> exchange_what_;        // per exchange request
  std::vector<char> headers_in_, header_out_;  // an all-gather's headers: one from each node, one sent to all
  std::vector<const void*> sources_;
  std::string error_;
  bool truncated_ = false;
  int slow_last_node_us_ = 0;  // test hook (ZERO_TEST_MPI_SLOW_LAST_NODE_US)
};

}  // namespace zero_mpi
