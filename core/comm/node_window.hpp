// Collectives through one shared-memory window, for a communicator whose ranks all share a node: the MPI module's
// window (MPI_Win_allocate_shared, backends/mpi) and the shared-memory communicator's segment (shm_segment.hpp) run the
// same protocol over memory they map differently, so both give the same bits.
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
// One arrival per chunk, no system call, no temporary allocated per call (Open MPI's reduce-scatter page-faults fresh
// temporaries on every call). Waiting is polled: step() does what it can and returns false while a peer is behind,
// so the backend's wait loop keeps its timeout, its abort and its notices from ranks that stopped.
//
// The arrival counters are 64-bit atomics in shared memory, which x86-64 and AArch64 keep coherent across processes
// (lock-free atomics are address-free); the release/acquire pair orders the plain copies around them.
//
// Single copy. Where the kernel lets a process read its peers' memory (process_vm_readv, Linux's cross-memory
// attach, which Open MPI's shared-memory transport uses too; a probe at creation decides, on every rank alike), a
// collective of at least kDirectMinBytes per block skips the window's halves: every rank publishes its buffer's
// address (with its descriptor) and arrives; once all have, each reads straight from the peers' buffers — an
// all-gather the peers' blocks into its own buffer (one copy of every byte instead of two), a reduce-scatter its
// block's pieces from every peer into its half (private staging, in cache) and then sums them with its own in rank
// order, the same sum_in_rank_order as every path — and arrives again; it is done when every rank has, so no
// buffer changes while a peer still reads it. Two arrivals per collective instead of one per chunk.
// Zero copy. Where the owner maps a shared arena (shared_arena.hpp: the shared-memory communicator's), a rank whose
// buffer lies in its share of it publishes the buffer's offset there too, and the peers read that buffer in place:
// a reduce-scatter sums such a peer's piece straight from its memory (no staging read: one pass over the peers'
// data instead of two), an all-gather copies it with memcpy rather than a system call. Ranks mix freely (a buffer
// the arena could not hold is read with process_vm_readv as before); the sum and its order are the same.
// A reduce-scatter given a sink (reduced_sink.hpp) hands it each piece's sources, which the engine's accumulator sums
// straight into itself (this rank's block of the buffer is then never written), or, where the sink declines, each
// summed piece as soon as it is stored, which the accumulator takes from cache.
// The owner of the memory turns single copy off where it is not wanted (ZERO_MPI_SINGLE_COPY=0,
// ZERO_SHM_SINGLE_COPY=0).
//
// All-reduces and broadcasts always use the halves (the agreements' few bytes; a broadcast of rank 0's initial values
// at setup copies twice, which only setup pays): an all-reduce copies every
// rank's chunk into its half and each rank reduces all halves in rank order (min, max, or a sum in rank order,
// the same on every rank); a broadcast copies the root's chunk out of the root's half.
#pragma once

#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "comm/rank_order_sum.hpp"
#include "comm/reduced_sink.hpp"
#include "zero/zero.h"

namespace zero {

class NodeWindow {
 public:
  // Bytes of one rank's slot for halves of `half_bytes`.
  static constexpr size_t kLine = 128;
  // Single copy from this many bytes per block: smaller blocks take the halves, whose one arrival is cheaper.
  static constexpr size_t kDirectMinBytes = 32 << 10;
  static size_t slot_bytes(size_t half_bytes) { return kLine + 2 * half_bytes; }

  // Over `slots` (every rank's slot of slot_bytes(half_bytes), mapped in this process), made by the owner of the
  // memory, which then zeroes this rank's line (reset_line), publishes the probe (publish_probe), and once every
  // rank has, probes the peers (probe_peers) and sets single copy by what every rank found. `release` gives the
  // memory back (free(); collective where the mapping's owner says so).
  NodeWindow(int rank, int size, size_t half_bytes, std::vector<char*> slots, std::function<void()> release)
      : rank_(rank), size_(size), half_(half_bytes), slots_(std::move(slots)), release_(std::move(release)) {}
  NodeWindow(const NodeWindow&) = delete;
  NodeWindow& operator=(const NodeWindow&) = delete;
  ~NodeWindow() = default;

  void reset_line() {
    std::memset(slots_[static_cast<size_t>(rank_)], 0, kLine);
    __atomic_store_n(counter(rank_), uint64_t{0}, __ATOMIC_RELEASE);
  }
  // Single copy: every rank publishes its process id and the address of a word holding it; probe_peers reads every
  // peer's word. The path is on only if every read worked everywhere (same user, no ptrace restriction, no seccomp
  // filter in the way): the owner agrees on it across ranks and calls set_single_copy. Nobody may read a probe word
  // after its owner has gone on to its first collective, so the owner separates the probe from it by a barrier.
  void publish_probe() {
    probe_word_ = static_cast<uint64_t>(getpid());
    line(rank_)[kPidWord] = static_cast<uint64_t>(getpid());
    line(rank_)[kProbeWord] = reinterpret_cast<uintptr_t>(&probe_word_);
  }
  bool probe_peers() {
    for (int r = 0; r < size_; ++r) {
      if (r == rank_) continue;
      uint64_t got = 0;
      if (!read_peer(r, &got, line(r)[kProbeWord], sizeof got) || got != line(r)[kPidWord]) return false;
    }
    return true;
  }
  void set_single_copy(bool on, std::string how_to_turn_off) {
    direct_ = on;
    single_copy_off_ = std::move(how_to_turn_off);
  }
  // Blocks of at least `bytes` go single copy (when it is on); the same on every rank. kDirectMinBytes by default.
  void set_direct_min_bytes(size_t bytes) { direct_min_ = bytes; }
  // The node's shared arena (shared_arena.hpp) as this process maps it: rank r's share of `share_bytes` at
  // base + r * share_bytes (zero copy, above). `owner` keeps the mapping. Plain pointers: the MPI module compiles
  // this window without the arena.
  void set_arena(const char* base, size_t share_bytes, std::shared_ptr<const void> owner) {
    arena_base_ = base;
    arena_share_ = share_bytes;
    arena_owner_ = std::move(owner);
  }

  // Whether collectives of direct_min_bytes per block and more read straight from the peers' buffers.
  bool single_copy() const { return direct_; }

  // Gives the memory back (zero_comm_finalize; collective where the owner's release is).
  void free() {
    if (release_) std::exchange(release_, nullptr)();
  }

  // A collective in progress through the window.
  struct Op {
    uint64_t sequence = 0;  // the communicator's collective number (checked against the peers')
    uint64_t count = 0;
    int32_t kind = 0;  // zero_collective_kind
    int32_t dtype = 0;
    bool first_chunk = true;
    char* buf = nullptr;
    size_t block_bytes = 0;  // one rank's block
    size_t esize = 1;
    size_t offset = 0;  // bytes of the block done
    bool copied = false;
    bool direct = false;  // single copy: read from the peers' buffers (see the top of this file)
    int phase = 0;        // single copy: 0 publish, 1 read, 2 wait for the peers to finish reading
    uint64_t s = 0;       // single copy: its first chunk number (it takes two)
    int peer = 0;         // single copy, all-gather: the peer being read
    int32_t op = 0;       // all-reduce: ZERO_REDUCE_SUM, _MIN or _MAX
    int root = 0;         // broadcast
    // Single-copy reduce-scatter: takes this rank's summed block piece by piece as it is stored
    // (comm/reduced_sink.hpp). Ignored elsewhere.
    ReducedSink* sink = nullptr;
  };

  // `reduce_op` (all-reduce) and `root` (broadcast) as in zero_collective_t. An all-reduce takes ZERO_DTYPE_FP32,
  // FP64 or INT64.
  Op begin(uint64_t sequence, int32_t kind, int32_t dtype, void* buf, uint64_t count, size_t esize,
           int32_t reduce_op = ZERO_REDUCE_SUM, int root = 0) const {
    Op op;
    op.op = reduce_op;
    op.root = root;
    op.sequence = sequence;
    op.count = count;
    op.kind = kind;
    op.dtype = dtype;
    op.buf = static_cast<char*>(buf);
    op.esize = esize;
    op.block_bytes = static_cast<size_t>(count) * esize;
    // The same decision on every rank.
    op.direct = direct_ && op.block_bytes >= direct_min_ && op.block_bytes > 0 &&
                (kind == ZERO_COLL_REDUCE_SCATTER || kind == ZERO_COLL_ALL_GATHER);
    return op;
  }

  enum class Progress { kWaiting, kDone, kMismatch, kFailed };

  // Advances `op` as far as the peers allow, at most kChunksPerCall chunks (so that the caller's wait loop keeps
  // answering aborts and queries during a long collective). kMismatch: a peer is in another collective (mismatch()
  // says which); nothing was summed from it.
  Progress step(Op& op) {
    if (op.direct) return step_direct(op);
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
        } else if (op.kind == ZERO_COLL_ALL_GATHER) {
          std::memcpy(my_half, op.buf + rank_ * op.block_bytes + op.offset, chunk);
        } else if (op.kind == ZERO_COLL_ALL_REDUCE || rank_ == op.root) {
          std::memcpy(my_half, op.buf + op.offset, chunk);
        }
        if (op.first_chunk) write_descriptor(s, op.sequence, op.kind, op.dtype, op.count, detail(op));
        arrive(s);
        op.copied = true;
      }
      if (!all_arrived(s + 1)) return Progress::kWaiting;
      if (op.first_chunk) {
        if (!peers_agree(s)) return Progress::kMismatch;
        op.first_chunk = false;
      }
      if (op.kind == ZERO_COLL_REDUCE_SCATTER) {
        sources_.resize(static_cast<size_t>(size_));
        char* mine = op.buf + rank_ * op.block_bytes + op.offset;
        for (int r = 0; r < size_; ++r)
          sources_[static_cast<size_t>(r)] = r == rank_ ? mine : half(r, s) + static_cast<size_t>(rank_) * chunk;
        zero::sum_in_rank_order(mine, sources_.data(), size_, chunk / op.esize, op.dtype);
      } else if (op.kind == ZERO_COLL_ALL_GATHER) {
        for (int r = 0; r < size_; ++r)
          if (r != rank_) std::memcpy(op.buf + r * op.block_bytes + op.offset, half(r, s), chunk);
      } else if (op.kind == ZERO_COLL_ALL_REDUCE) {
        reduce_halves_in_rank_order(op, s, chunk);
      } else if (rank_ != op.root) {
        std::memcpy(op.buf + op.offset, half(op.root, s), chunk);
      }
      op.offset += chunk;
      op.copied = false;
      finish_chunk(s);
    }
    return Progress::kDone;
  }

  const std::string& mismatch() const { return mismatch_; }
  // Why a single-copy read failed (Progress::kFailed).
  const std::string& failure() const { return failure_; }

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
  // `detail`: an all-reduce's op, a broadcast's root (0 otherwise), so that ranks that disagree on it fail too.
  void write_descriptor(uint64_t s, uint64_t sequence, int32_t kind, int32_t dtype, uint64_t count,
                        uint32_t detail = 0) {
    uint64_t* d = descriptor(rank_, s);
    d[0] = sequence;
    d[1] = (static_cast<uint64_t>(static_cast<uint16_t>(kind)) << 48) |
           (static_cast<uint64_t>(static_cast<uint16_t>(dtype)) << 32) | detail;
    d[2] = count;
  }
  // False (and mismatch() says how) when a peer wrote another descriptor than this rank's for the collective whose
  // first chunk is s. `names` names a peer for the message (its rank in the window by default).
  bool peers_agree(uint64_t s, const std::vector<int>* names = nullptr) {
    const uint64_t* mine = descriptor(rank_, s);
    for (int r = 0; r < size_; ++r) {
      const uint64_t* d = descriptor(r, s);
      if (d[0] == mine[0] && d[1] == mine[1] && d[2] == mine[2]) continue;
      const int name = names != nullptr ? (*names)[static_cast<size_t>(r)] : r;
      const auto describe = [](const uint64_t* w) {
        return "kind " + std::to_string(w[1] >> 48) + ", dtype " + std::to_string((w[1] >> 32) & 0xffffu) +
               ((w[1] & 0xffffffffu) != 0 ? ", op or root " + std::to_string(w[1] & 0xffffffffu) : std::string()) +
               ", " + std::to_string(w[2]) + " elements per rank";
      };
      mismatch_ = "rank " + std::to_string(name) + " is in collective #" + std::to_string(d[0]) + " (" + describe(d) +
                  ") while this rank is in #" + std::to_string(mine[0]) + " (" + describe(mine) + ")";
      return false;
    }
    return true;
  }

 private:
  // At the start of a slot: the arrival counter, two descriptors (words 1-6), the process id, the probe word's
  // address and, per descriptor, the address of the buffer a single-copy collective reads and its offset in the
  // rank's share of the arena plus one (0: not in the arena).
  static constexpr int kPidWord = 7, kProbeWord = 8, kBufferWord = 9;  // kBufferWord + s % 2
  static constexpr int kArenaWord = 11;                                // kArenaWord + s % 2

  static constexpr int kChunksPerCall = 64;
  static constexpr size_t kDirectPiece = 1 << 20;  // an all-gather reads at most this much per system call
  // A reduce-scatter reads at most this much of each peer's piece, then sums: small enough that the pieces stay in
  // L2 between the read and the sum (measured at 2 ranks: 128 KiB about 1.15x the throughput of 512 KiB at 16 MiB,
  // the same at 256 MiB; 16 KiB loses to the system calls).
  static constexpr size_t kDirectSumPiece = 128 << 10;

  // Peer r's buffer of `bytes` of the single-copy collective whose first chunk is s, where this process maps it
  // (the arena), or null when it must be read with process_vm_readv.
  const char* resident(int r, uint64_t s, size_t bytes) const {
    const uint64_t at = line(r)[kArenaWord + s % 2];
    // A buffer the share cannot hold (a peer's corrupt line) is read with the system call, which checks it.
    if (at == 0 || arena_base_ == nullptr || at - 1 >= arena_share_ || bytes > arena_share_ - (at - 1)) return nullptr;
    return arena_base_ + static_cast<size_t>(r) * arena_share_ + (at - 1);
  }
  // This rank's [p, p + bytes) as an offset in its share plus one, or 0 when it is not all in the share.
  uint64_t arena_word(const void* p, size_t bytes) const {
    if (arena_base_ == nullptr) return 0;
    const uintptr_t mine = reinterpret_cast<uintptr_t>(arena_base_) + static_cast<uintptr_t>(rank_) * arena_share_;
    const uintptr_t q = reinterpret_cast<uintptr_t>(p);
    if (q < mine || q >= mine + arena_share_ || bytes > mine + arena_share_ - q) return 0;
    return static_cast<uint64_t>(q - mine) + 1;
  }

  uint64_t* line(int r) const { return reinterpret_cast<uint64_t*>(slots_[static_cast<size_t>(r)]); }
  uint64_t* counter(int r) const { return line(r); }
  uint64_t* descriptor(int r, uint64_t s) const { return counter(r) + 1 + 3 * (s % 2); }

  // Reads n bytes at `remote` in peer r's memory into `local`, continuing short reads; false on failure (failure_
  // says why).
  bool read_peer(int r, void* local, uint64_t remote, size_t n) {
    const pid_t pid = static_cast<pid_t>(line(r)[kPidWord]);
    size_t done = 0;
    while (done < n) {
      iovec mine{static_cast<char*>(local) + done, n - done};
      iovec theirs{reinterpret_cast<void*>(static_cast<uintptr_t>(remote + done)), n - done};
      const ssize_t got = process_vm_readv(pid, &mine, 1, &theirs, 1, 0);
      if (got <= 0) {
        if (got < 0 && errno == EINTR) continue;
        const int err = got < 0 ? errno : 0;
        failure_ = "process_vm_readv of " + std::to_string(n) + " bytes from rank " + std::to_string(r) + " (pid " +
                   std::to_string(pid) + ") failed: " + (got < 0 ? std::strerror(err) : "no bytes");
        if (err == EFAULT)
          failure_ +=
              " (memory the kernel cannot share between processes, such as a framework's pinned or device-mapped "
              "buffers; " +
              single_copy_off_ + " copies through the shared window instead)";
        return false;
      }
      done += static_cast<size_t>(got);
    }
    return true;
  }

  // A single-copy collective (see the top of this file): chunk numbers s (published) and s + 1 (read).
  Progress step_direct(Op& op) {
    if (op.phase == 0) {
      op.s = next_chunk_;
      if (!all_arrived(op.s)) return Progress::kWaiting;
      write_descriptor(op.s, op.sequence, op.kind, op.dtype, op.count);
      line(rank_)[kBufferWord + op.s % 2] = reinterpret_cast<uintptr_t>(op.buf);
      line(rank_)[kArenaWord + op.s % 2] = arena_word(op.buf, static_cast<size_t>(size_) * op.block_bytes);
      arrive(op.s);
      op.phase = 1;
#ifdef ZERO_TEST_HOOKS
      // The failure tests stop this rank here: its buffer published, the peers about to read it.
      if (const char* stop = std::getenv("ZERO_TEST_MPI_STOP_IN_SINGLE_COPY");
          stop != nullptr && std::atoi(stop) == rank_) {
        failure_ = "injected stop in a single-copy collective on rank " + std::to_string(rank_) +
                   " (ZERO_TEST_MPI_STOP_IN_SINGLE_COPY)";
        return Progress::kFailed;
      }
#endif
    }
    if (op.phase == 1) {
      if (!all_arrived(op.s + 1)) return Progress::kWaiting;
      if (op.first_chunk) {
        if (!peers_agree(op.s)) return Progress::kMismatch;
        op.first_chunk = false;
      }
      const uint64_t mine = static_cast<uint64_t>(rank_) * op.block_bytes;
      for (int done = 0; done < kChunksPerCall; ++done) {
        if (op.kind == ZERO_COLL_ALL_GATHER) {
          // Each peer's block, straight into this rank's buffer, in pieces.
          if (op.peer == rank_) ++op.peer;
          if (op.peer >= size_) break;
          const uint64_t at = static_cast<uint64_t>(op.peer) * op.block_bytes + op.offset;
          const size_t n = std::min(kDirectPiece, op.block_bytes - op.offset);
          if (const char* theirs = resident(op.peer, op.s, static_cast<size_t>(size_) * op.block_bytes))
            std::memcpy(op.buf + at, theirs + at, n);
          else if (!read_peer(op.peer, op.buf + at, line(op.peer)[kBufferWord + op.s % 2] + at, n))
            return Progress::kFailed;
          op.offset += n;
          if (op.offset == op.block_bytes) op.offset = 0, ++op.peer;
        } else {
          // This rank's block, piece by piece: each peer's piece in place where it lies in the arena, else read
          // into this rank's half; then the sources, in rank order with this rank's own piece, to the sink, which
          // sums them into its accumulator — or, without one or where it declines, the sum in place, which a sink
          // then takes from cache.
          if (op.offset == op.block_bytes) break;
          size_t per = std::min(kDirectSumPiece, half_ / static_cast<size_t>(size_ - 1)) / 64 * 64;
          per = std::max(op.esize, per / op.esize * op.esize);
          const size_t n = std::min(per, op.block_bytes - op.offset);
          char* staging = half(rank_, 0);
          sources_.resize(static_cast<size_t>(size_));
          for (int r = 0, slot = 0; r < size_; ++r) {
            if (r == rank_) {
              sources_[static_cast<size_t>(r)] = op.buf + mine + op.offset;
              continue;
            }
            if (const char* theirs = resident(r, op.s, static_cast<size_t>(size_) * op.block_bytes)) {
              sources_[static_cast<size_t>(r)] = theirs + mine + op.offset;
              continue;
            }
            char* into = staging + static_cast<size_t>(slot++) * per;
            if (!read_peer(r, into, line(r)[kBufferWord + op.s % 2] + mine + op.offset, n)) return Progress::kFailed;
            sources_[static_cast<size_t>(r)] = into;
          }
          char* sum = op.buf + mine + op.offset;
          const size_t first = op.offset / op.esize, count = n / op.esize;
          if (op.sink == nullptr || !op.sink->take_sources(sources_.data(), size_, op.dtype, first, count)) {
            zero::sum_in_rank_order(sum, sources_.data(), size_, count, op.dtype);
            if (op.sink != nullptr) op.sink->take(sum, first, count);
          }
          op.offset += n;
        }
      }
      const bool read_all = op.kind == ZERO_COLL_ALL_GATHER ? op.peer >= size_ : op.offset == op.block_bytes;
      if (!read_all) return Progress::kWaiting;
      arrive(op.s + 1);
      op.phase = 2;
    }
    // Done when every peer has read what it needs from this rank's buffer.
    if (!all_arrived(op.s + 2)) return Progress::kWaiting;
    finish_chunk(op.s + 1);
    op.offset = op.block_bytes;
    return Progress::kDone;
  }
  static uint32_t detail(const Op& op) {
    return op.kind == ZERO_COLL_ALL_REDUCE  ? static_cast<uint32_t>(op.op)
           : op.kind == ZERO_COLL_BROADCAST ? static_cast<uint32_t>(op.root)
                                            : 0u;
  }
  // An all-reduce's chunk: every rank's copy is in its half s; the result, the same on every rank, goes into the
  // caller's buffer.
  template <typename T>
  void reduce_halves(T* dst, uint64_t s, size_t n, int32_t reduce_op) const {
    for (size_t i = 0; i < n; ++i) {
      T acc = reinterpret_cast<const T*>(half(0, s))[i];
      for (int r = 1; r < size_; ++r) {
        const T v = reinterpret_cast<const T*>(half(r, s))[i];
        acc = reduce_op == ZERO_REDUCE_MIN   ? (v < acc ? v : acc)
              : reduce_op == ZERO_REDUCE_MAX ? (v > acc ? v : acc)
                                             : acc + v;
      }
      dst[i] = acc;
    }
  }
  void reduce_halves_in_rank_order(const Op& op, uint64_t s, size_t chunk) const {
    char* dst = op.buf + op.offset;
    if (op.dtype == ZERO_DTYPE_FP64)
      reduce_halves(reinterpret_cast<double*>(dst), s, chunk / 8, op.op);
    else if (op.dtype == ZERO_DTYPE_INT64)
      reduce_halves(reinterpret_cast<int64_t*>(dst), s, chunk / 8, op.op);
    else
      reduce_halves(reinterpret_cast<float*>(dst), s, chunk / 4, op.op);
  }
  // A reduce-scatter puts every rank's share of the chunk in a half; the others only one. Whole elements.
  size_t chunk_bytes(const Op& op) const {
    size_t per = op.kind == ZERO_COLL_REDUCE_SCATTER ? half_ / static_cast<size_t>(size_) : half_;
    if (per >= 64) per = per / 64 * 64;  // every share starts on a cache line
    const size_t whole = std::max<size_t>(op.esize, per / op.esize * op.esize);
    return std::min(whole, op.block_bytes - op.offset);
  }

  int rank_ = 0, size_ = 1;
  size_t half_ = 0;
  std::vector<char*> slots_;
  std::function<void()> release_;
  std::string single_copy_off_;
  std::vector<const void*> sources_;
  std::string mismatch_;
  uint64_t next_chunk_ = 0;  // chunk s waits for every counter to reach s (chunk 0: the initial 0s)
  bool direct_ = false;      // single copy (process_vm_readv) works between every pair of ranks
  size_t direct_min_ = kDirectMinBytes;
  const char* arena_base_ = nullptr;  // every rank's share of the arena, mapped here (null: none)
  size_t arena_share_ = 0;
  std::shared_ptr<const void> arena_owner_;
  uint64_t probe_word_ = 0;  // read by the peers at creation
  std::string failure_;
};

}  // namespace zero
