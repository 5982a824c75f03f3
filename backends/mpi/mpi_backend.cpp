// libzero's MPI backend (libzero-mpi.so.1): zero.h's communicator callbacks over MPI, in a module of its own so
// that libzero.so links no MPI (a Python wheel cannot carry one MPI ABI; a Java program must not need mpirun to
// load libzero).
//
// Collectives are MPI's non-blocking ones, waited for by polling, so libzero's watchdog can give up on a
// collective that never completes. Reductions are deterministic: a reduce-scatter is an in-place all-to-all (the
// bytes a ring reduce-scatter sends) and a local sum in rank order 0..N-1 (MPI's own reductions pick their order
// by algorithm and message size).
//
// Beside the data communicator, a second duplicate carries small control messages, so that no rank waits without
// knowing why:
//  - NOTICE: "rank r stops after collective #k, because ..." — sent when this rank aborts (a timeout, a failure
//    after data moved, zero_engine_abort), destroys the communicator, calls MPI_Finalize (an attribute on
//    MPI_COMM_SELF runs first thing in MPI_Finalize) or exits (atexit). A rank waiting in a collective numbered
//    above k fails at once with ZERO_ERR_REMOTE naming r and its reason.
//  - QUERY / REPLY: after a timeout, the waiting rank asks every other rank what it is doing; ranks inside a
//    libzero collective answer (which collective, for how long), the silence of the others is itself the
//    diagnosis ("not inside libzero").
// Control messages are only sent and received from the thread that makes libzero's calls (MPI's thread levels
// below MPI_THREAD_MULTIPLE allow no other), inside the polling loop.
#include <mpi.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "comm/rank_order_sum.hpp"
#include "hierarchy.hpp"
#include "message_blocks.hpp"
#include "mpi_backend.h"
#include "node_window.hpp"

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

struct Failure {
  zero_status_t status;
  std::string message;
};

[[noreturn]] void fail(zero_status_t status, const std::string& message) { throw Failure{status, message}; }

void check(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  fail(ZERO_ERR_COMM, std::string(what) + " failed: " + std::string(text, static_cast<size_t>(len)));
}

// ---- Control messages --------------------------------------------------------------------------------------
enum CtlType : int { kNotice = 1, kQuery = 2, kReply = 3 };

struct CtlMsg {
  int32_t type = 0;
  int32_t rank = 0;
  uint64_t a = 0;      // NOTICE: last collective completed; QUERY: the asker's collective; REPLY: collective waited in
  uint64_t b = 0;      // NOTICE: the first collective started and not completed (UINT64_MAX: none); REPLY: last
                       // collective completed
  double seconds = 0;  // REPLY: how long it has waited
  char text[224] = {};
};
static_assert(sizeof(CtlMsg) == 256, "control messages are one fixed size");

// A message's text, cut with "..." if it does not fit.
void copy_text(char (&out)[224], const std::string& s) {
  std::string text = s;
  if (text.size() >= sizeof out) text = text.substr(0, sizeof out - 4) + "...";
  std::memcpy(out, text.data(), text.size());
  out[text.size()] = '\0';
}

struct Peer {
  uint64_t left_after = UINT64_MAX;  // it stopped after completing this collective (UINT64_MAX: still with us)
  uint64_t left_open = UINT64_MAX;   // the first collective it had started and not completed when it stopped
  std::string reason;
  uint64_t heard = 0;    // the order in which this rank heard of the peers that stopped (1, 2, ...)
  bool replied = false;  // in the current diagnosis round
  CtlMsg reply;
};

// ---- Process-wide state --------------------------------------------------------------------------------------
class Backend;
std::mutex g_mutex;
bool g_we_initialized_mpi = false;
bool g_hooks_installed = false;
std::vector<Backend*> g_live;  // created, neither finalized nor destroyed
int g_provided = MPI_THREAD_SINGLE;

void say_goodbye_all(const std::string& reason);

int finalize_hook(MPI_Comm, int, void*, void*) {
  say_goodbye_all("it called MPI_Finalize");
  return MPI_SUCCESS;
}

void exit_hook() {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (!initialized || finalized) return;
  say_goodbye_all("its process is exiting");
  bool ours = false;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    ours = g_we_initialized_mpi;
  }
  // libzero started MPI for this program, so libzero ends it (MPI_Finalize is collective over the world: every
  // rank reaches this as its process exits).
  if (ours) MPI_Finalize();
}

void install_hooks() {
  if (g_hooks_installed) return;
  g_hooks_installed = true;
  int key = MPI_KEYVAL_INVALID;
  if (MPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, finalize_hook, &key, nullptr) == MPI_SUCCESS)
    MPI_Comm_set_attr(MPI_COMM_SELF, key, nullptr);
  std::atexit(exit_hook);
}

MPI_Datatype base_type(int32_t dtype) {
  switch (dtype) {
    case ZERO_DTYPE_FP32:
      return MPI_FLOAT;
    case ZERO_DTYPE_FP64:
      return MPI_DOUBLE;
    case ZERO_DTYPE_INT64:
      return MPI_INT64_T;
    case ZERO_DTYPE_BF16:
    case ZERO_DTYPE_FP16:
      return MPI_UINT16_T;  // moved as bits; sums happen in sum_blocks_in_rank_order
    case ZERO_DTYPE_UINT8:
      return MPI_BYTE;
    default:
      fail(ZERO_ERR_INVALID_ARGUMENT, "unknown dtype " + std::to_string(dtype));
  }
}

// MPI counts are int. A larger count is sent as count / block elements of a contiguous type of `block` elements
// (message_blocks.hpp); the type lives as long as the collective (Op) that uses it, on every path. The test build
// of this module (ZERO_TEST_HOOKS) takes a lower limit for unit data (float elements) from the environment variable
// ZERO_TEST_MPI_MAX_COUNT, so that the tests run the blocked path on small messages.
class Count {
 public:
  Count() = default;
  Count(const Count&) = delete;
  Count& operator=(const Count&) = delete;
  Count(Count&& o) noexcept { *this = std::move(o); }
  Count& operator=(Count&& o) noexcept {
    std::swap(n, o.n), std::swap(type, o.type), std::swap(derived, o.derived);
    return *this;
  }
  // MPI allows freeing a type while a request still uses it; after MPI_Finalize nothing may be called.
  ~Count() {
    int finalized = 0;
    if (derived && MPI_Finalized(&finalized) == MPI_SUCCESS && !finalized) MPI_Type_free(&type);
  }
  int n = 0;
  MPI_Datatype type = MPI_DATATYPE_NULL;
  bool derived = false;
};
uint64_t max_count(int32_t dtype) {
#ifdef ZERO_TEST_HOOKS
  static const uint64_t limit = [] {
    const char* env = std::getenv("ZERO_TEST_MPI_MAX_COUNT");
    return env != nullptr && env[0] != '\0' ? std::strtoull(env, nullptr, 10) : uint64_t{INT_MAX};
  }();
  if (dtype == ZERO_DTYPE_FP32 || dtype == ZERO_DTYPE_BF16 || dtype == ZERO_DTYPE_FP16) return limit;
#endif
  (void)dtype;
  return INT_MAX;
}
Count mpi_count(uint64_t count, int32_t dtype) {
  Count c;
  c.type = base_type(dtype);
  const uint64_t block = zero::message_block(count, max_count(dtype));
  if (block == 0 || block > uint64_t{INT_MAX})
    fail(ZERO_ERR_UNSUPPORTED, "a message of " + std::to_string(count) +
                                   " elements has no power-of-two factor that brings it under MPI's int count");
  c.n = static_cast<int>(count / block);
  if (block > 1) {
    MPI_Datatype t;
    check(MPI_Type_contiguous(static_cast<int>(block), c.type, &t), "MPI_Type_contiguous");
    if (MPI_Type_commit(&t) != MPI_SUCCESS) {
      MPI_Type_free(&t);
      fail(ZERO_ERR_COMM, "MPI_Type_commit failed for a block of " + std::to_string(block) + " elements");
    }
    c.type = t;
    c.derived = true;
  }
  return c;
}

// One collective in flight: an MPI request, or a collective through the node's shared window.
struct Op {
  zero_collective_t coll;
  std::string label;
  MPI_Request request = MPI_REQUEST_NULL;
  Count count;
  bool shm = false;                   // moved through window_queue_ (the node's window, or the hierarchy)
  bool hier = false;                  // by the hierarchy (several nodes), not by the one-node window
  std::atomic<bool> shm_done{false};  // the window moved every chunk (the op left window_queue_)
  std::string refused;                // not started: a rank stopped before it (the error its wait gives)
  zero_mpi::NodeWindow::Op shm_op;
  zero_mpi::Hierarchy::Op hier_op;
};

size_t dtype_bytes(int32_t dtype) {
  switch (dtype) {
    case ZERO_DTYPE_FP32:
      return 4;
    case ZERO_DTYPE_FP64:
    case ZERO_DTYPE_INT64:
      return 8;
    case ZERO_DTYPE_BF16:
    case ZERO_DTYPE_FP16:
      return 2;
    default:
      return 1;
  }
}

// The shared-memory path (node_window.hpp) when every rank is on one node, unless ZERO_MPI_SHM=0 on any rank;
// ZERO_MPI_SHM_HALF_BYTES sets the chunk buffer per rank (two of them; 512 KiB by default: a chunk stays in cache
// between its copy and its sum).
// The window's collectives move in a progress thread of the backend while the caller computes, when this rank has
// a spare core: two CPUs in its affinity mask when mpirun or the scheduler bound it to some, else two hardware
// threads per rank on the node. Otherwise only inside waits, where they would compete with the caller's own
// compute for the same cores. ZERO_MPI_PROGRESS_THREAD=1 or 0 decides instead.
bool want_progress_thread(int ranks_on_node) {
  const char* env = std::getenv("ZERO_MPI_PROGRESS_THREAD");
  if (env != nullptr && *env != '\0') return std::strcmp(env, "0") != 0;
  const unsigned machine = std::thread::hardware_concurrency();
  cpu_set_t mask;
  CPU_ZERO(&mask);
  if (sched_getaffinity(0, sizeof mask, &mask) == 0) {
    const unsigned mine = static_cast<unsigned>(CPU_COUNT(&mask));
    if (mine < machine) return mine >= 2;  // bound to some CPUs: those are this rank's
  }
  return machine >= 2u * static_cast<unsigned>(std::max(1, ranks_on_node));
}

size_t shm_half_bytes() {
  const char* env = std::getenv("ZERO_MPI_SHM_HALF_BYTES");
  const unsigned long long v = env != nullptr ? std::strtoull(env, nullptr, 10) : 0;
  return v >= 4096 && v <= (1ull << 30) ? static_cast<size_t>(v) : size_t{512} << 10;
}

// The node of every rank, as its node communicator and the layout of all of them (collective over `data`).
struct Topology {
  MPI_Comm node = MPI_COMM_NULL;  // this rank's node
  int node_size = 1;              // ranks on this rank's node
  bool single_node = false;       // every rank on one node
  bool blocks = false;            // several nodes of L >= 2 ranks each, node k holding ranks kL .. kL + L - 1
};

// Nodes are MPI_Comm_split_type(MPI_COMM_TYPE_SHARED)'s. The test build of the module can cut one machine into
// "nodes" instead (ZERO_TEST_MPI_NODES="0,0,1,1": a node number per rank), so that the tests run the hierarchical
// path on one machine — with real windows inside each and real MPI messages between them.
Topology find_topology(MPI_Comm data, int rank, int size) {
  Topology t;
  bool split = false;
#ifdef ZERO_TEST_HOOKS
  if (const char* nodes = std::getenv("ZERO_TEST_MPI_NODES"); nodes != nullptr && *nodes != '\0') {
    std::vector<int> of_rank;
    for (const char* p = nodes; *p != '\0';) {
      char* end = nullptr;
      of_rank.push_back(static_cast<int>(std::strtol(p, &end, 10)));
      if (end == p) break;
      p = *end == ',' ? end + 1 : end;
    }
    if (static_cast<int>(of_rank.size()) != size)
      fail(ZERO_ERR_INVALID_ARGUMENT, "ZERO_TEST_MPI_NODES names " + std::to_string(of_rank.size()) +
                                          " ranks' nodes, not " + std::to_string(size));
    check(MPI_Comm_split(data, of_rank[static_cast<size_t>(rank)], rank, &t.node), "MPI_Comm_split");
    split = true;
  }
#endif
  if (!split)
    check(MPI_Comm_split_type(data, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &t.node), "MPI_Comm_split_type");
  int local = 0;
  check(MPI_Comm_size(t.node, &t.node_size), "MPI_Comm_size");
  check(MPI_Comm_rank(t.node, &local), "MPI_Comm_rank");
  // Every rank's (first rank of its node, rank on its node, node size).
  int first = rank;
  check(MPI_Allreduce(MPI_IN_PLACE, &first, 1, MPI_INT, MPI_MIN, t.node), "MPI_Allreduce");
  int mine[3] = {first, local, t.node_size};
  std::vector<int> all(3 * static_cast<size_t>(size));
  check(MPI_Allgather(mine, 3, MPI_INT, all.data(), 3, MPI_INT, data), "MPI_Allgather");
  t.single_node = all[2] == size;
  const int l = all[2];
  bool blocks = l >= 2 && size % l == 0 && size / l >= 2;
  for (int r = 0; r < size && blocks; ++r)
    blocks = all[3 * r] == r / l * l && all[3 * r + 1] == r % l && all[3 * r + 2] == l;
  t.blocks = blocks;
  return t;
}

class Backend {
 public:
  Backend(MPI_Comm data, MPI_Comm ctl) : data_(data), ctl_(ctl) {
    check(MPI_Comm_rank(data_, &rank_), "MPI_Comm_rank");
    check(MPI_Comm_size(data_, &size_), "MPI_Comm_size");
    {  // the ranks that share this one's cores (OpenMP threads per rank), whatever the tests call a node
      MPI_Comm shared = MPI_COMM_NULL;
      check(MPI_Comm_split_type(data_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &shared), "MPI_Comm_split_type");
      check(MPI_Comm_size(shared, &local_size_), "MPI_Comm_size");
      MPI_Comm_free(&shared);
    }
    Topology topology = find_topology(data_, rank_, size_);
    // Collective decision: every rank must agree to make the window (an environment that differs between ranks
    // must not leave some in MPI_Win_allocate_shared).
    const char* shm = std::getenv("ZERO_MPI_SHM");
    const bool shm_allowed = !(shm != nullptr && std::strcmp(shm, "0") == 0);
    int want = size_ > 1 && shm_allowed ? (topology.single_node ? 1 : topology.blocks ? 2 : 0) : 0;
    int agreed_min = want, agreed_max = want;
    check(MPI_Allreduce(MPI_IN_PLACE, &agreed_min, 1, MPI_INT, MPI_MIN, data_), "MPI_Allreduce");
    check(MPI_Allreduce(MPI_IN_PLACE, &agreed_max, 1, MPI_INT, MPI_MAX, data_), "MPI_Allreduce");
    want = agreed_min == agreed_max ? agreed_min : 0;  // the layout is the same everywhere: only the env may differ
    // Single copy (node_window.hpp) unless ZERO_MPI_SINGLE_COPY=0; the window agrees on it.
    const char* single = std::getenv("ZERO_MPI_SINGLE_COPY");
    const bool single_copy = !(single != nullptr && std::strcmp(single, "0") == 0);
    if (want == 1) window_ = zero_mpi::NodeWindow::create(data_, shm_half_bytes(), single_copy);
    if (want == 2) {
      hierarchy_ = zero_mpi::Hierarchy::create(data_, topology.node, shm_half_bytes());
      node_ = topology.node;  // the hierarchy's window lives on it
    } else {
      MPI_Comm_free(&topology.node);
    }
    // The hierarchy's collectives call MPI, which only the caller's thread may: no progress thread with it.
    use_progress_thread_ = window_ != nullptr && want_progress_thread(local_size_);
#ifdef ZERO_TEST_HOOKS
    // The tests of the window and hierarchy paths make sure they are the path they test.
    if (want == 1 && !window_ && std::getenv("ZERO_TEST_MPI_REQUIRE_SHM") != nullptr)
      fail(ZERO_ERR_INTERNAL, "ZERO_TEST_MPI_REQUIRE_SHM: the shared-memory window could not be made");
    if (window_ && single_copy && !window_->single_copy() &&
        std::getenv("ZERO_TEST_MPI_REQUIRE_SINGLE_COPY") != nullptr)
      fail(ZERO_ERR_INTERNAL,
           "ZERO_TEST_MPI_REQUIRE_SINGLE_COPY: process_vm_readv between the ranks does not work here (a ptrace or "
           "seccomp restriction?)");
    if (shm_allowed && !hierarchy_ && std::getenv("ZERO_TEST_MPI_REQUIRE_HIERARCHY") != nullptr)
      fail(ZERO_ERR_INTERNAL,
           "ZERO_TEST_MPI_REQUIRE_HIERARCHY: the collectives are not hierarchical (want " + std::to_string(want) + ")");
#endif
    peers_.resize(static_cast<size_t>(size_));
    post_inbox();
  }

  int rank() const { return rank_; }
  int size() const { return size_; }
  int local_size() const { return local_size_; }
  const char* error() const { return error_.c_str(); }

  template <typename Body>
  zero_status_t guarded(Body&& body) {
    try {
      body();
      return ZERO_OK;
    } catch (const Failure& f) {
      error_ = f.message;
      return f.status;
    } catch (const std::bad_alloc&) {
      error_ = "out of memory in the MPI backend";
      return ZERO_ERR_OUT_OF_MEMORY;
    } catch (const std::exception& e) {  // nothing may cross into libzero's C++ (std::thread's system_error)
      error_ = std::string("the MPI backend: ") + e.what();
      return ZERO_ERR_INTERNAL;
    }
  }

  // ---- Collectives
  Op* start(const zero_collective_t& coll) {
    enter();
    InCall in(this);
    poll_control();
    auto op = std::make_unique<Op>();
    op->coll = coll;
    op->label = coll.label != nullptr ? coll.label : "";
    op->coll.label = op->label.c_str();
    // A collective a stopped rank will never join is not started (nothing is posted to MPI or queued on the
    // window, so no request outlives the caller's buffer), and fails when it is waited for. Not here: the engine
    // starts all-gathers ahead of their use, and a program's last zero_gather calls leave such prefetches started
    // and never waited for on every rank; the rank that finishes first must not fail the others' last gathers.
    op->refused = stopped_peer(coll.sequence, op->label.c_str());
    if (!op->refused.empty()) return op.release();
    const bool float_type =
        coll.dtype == ZERO_DTYPE_FP32 || coll.dtype == ZERO_DTYPE_BF16 || coll.dtype == ZERO_DTYPE_FP16;
    if ((window_ || hierarchy_) &&
        (coll.kind == ZERO_COLL_ALL_GATHER || (coll.kind == ZERO_COLL_REDUCE_SCATTER && float_type))) {
      // Moved chunk by chunk inside any later wait of this communicator, strictly in start order (the same on
      // every rank, whatever order the engine waits in: window_queue_).
      op->shm = true;
      op->hier = hierarchy_ != nullptr;
      if (op->hier)
        op->hier_op =
            hierarchy_->begin(coll.sequence, coll.kind, coll.dtype, coll.buf, coll.count, dtype_bytes(coll.dtype));
      else
        op->shm_op =
            window_->begin(coll.sequence, coll.kind, coll.dtype, coll.buf, coll.count, dtype_bytes(coll.dtype));
      if (use_progress_thread_) start_progress_thread();  // before queueing: it may fail
      in_flight_[coll.sequence] = InFlight{op->label, Clock::now(), op.get()};
      {
        std::lock_guard<std::mutex> lock(window_mutex_);
        window_queue_.push_back(op.get());
      }
      if (use_progress_thread_) window_cv_.notify_one();
      return op.release();
    }
    op->count = mpi_count(coll.count, coll.dtype);
    const Count& c = op->count;
    switch (coll.kind) {
      case ZERO_COLL_ALL_GATHER:
        check(MPI_Iallgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, coll.buf, c.n, c.type, data_, &op->request),
              "MPI_Iallgather");
        break;
      case ZERO_COLL_REDUCE_SCATTER:
        if (coll.dtype != ZERO_DTYPE_FP32 && coll.dtype != ZERO_DTYPE_BF16 && coll.dtype != ZERO_DTYPE_FP16)
          fail(ZERO_ERR_INVALID_ARGUMENT, "reduce-scatter of a non-float dtype");
        check(MPI_Ialltoall(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, coll.buf, c.n, c.type, data_, &op->request),
              "MPI_Ialltoall");
        break;
      case ZERO_COLL_ALL_REDUCE: {
        if (coll.dtype != ZERO_DTYPE_FP32 && coll.dtype != ZERO_DTYPE_FP64 && coll.dtype != ZERO_DTYPE_INT64)
          fail(ZERO_ERR_UNSUPPORTED, "the MPI backend all-reduces fp32, fp64 and int64 only");
        if (c.derived) fail(ZERO_ERR_UNSUPPORTED, "an all-reduce of more than 2^31 elements");
        const MPI_Op mop = coll.op == ZERO_REDUCE_MIN ? MPI_MIN : coll.op == ZERO_REDUCE_MAX ? MPI_MAX : MPI_SUM;
        check(MPI_Iallreduce(MPI_IN_PLACE, coll.buf, c.n, c.type, mop, data_, &op->request), "MPI_Iallreduce");
        break;
      }
      case ZERO_COLL_BROADCAST:
        if (coll.root < 0 || coll.root >= size_) fail(ZERO_ERR_INVALID_ARGUMENT, "broadcast root out of range");
        check(MPI_Ibcast(coll.buf, c.n, c.type, coll.root, data_, &op->request), "MPI_Ibcast");
        break;
      default:
        fail(ZERO_ERR_INVALID_ARGUMENT, "unknown collective kind " + std::to_string(coll.kind));
    }
    in_flight_[coll.sequence] = InFlight{op->label, Clock::now(), op.get()};
    return op.release();
  }

  bool wait(Op* op, double timeout_s) {
    enter();
    InCall in(this);
    if (!op->refused.empty()) {
      const std::string why = op->refused;
      abandoned_.emplace_back(op);
      fail(ZERO_ERR_REMOTE, why);
    }
    // What this rank answers when asked what it waits in (until the collective completes, also while it
    // diagnoses its own timeout): this collective, not the oldest in flight (a prefetch nobody waits for yet is
    // not what holds this rank).
    waiting_ = op;
    const auto begin = Clock::now();
    for (;;) {
      // Every wait moves the window's queue, whatever it waits for: a rank waiting for a later collective (or a
      // control message) still moves the chunks its peers wait for, so that ranks that wait in different orders
      // never wait for each other.
      progress_window(op);
      int done = 0;
      if (op->shm) {
        done = op->shm_done.load(std::memory_order_acquire) ? 1 : 0;
      } else if (MPI_Test(&op->request, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS) {
        abandon(op);  // kept, with its type and buffer, as a collective given up in flight
        fail(ZERO_ERR_COMM,
             "MPI_Test failed on collective #" + std::to_string(op->coll.sequence) + " (" + op->label + ")");
      }
      if (done) {
        complete(op);
        return true;
      }
      poll_control();
      if (abort_requested_.load()) {  // zero_engine_abort from another thread: tell the others from this one
        abandon(op);
        say_goodbye(abort_reason());
        fail(ZERO_ERR_ABORTED, "the communicator was aborted on this rank: " + abort_reason());
      }
      try {
        const std::string stopped = stopped_peer(op->coll.sequence, op->label.c_str());
        if (!stopped.empty()) fail(ZERO_ERR_REMOTE, stopped);
      } catch (const Failure&) {
        abandon(op);
        throw;
      }
      if (seconds_since(begin) >= timeout_s) {
#ifdef ZERO_TEST_HOOKS
        // The moment an abort from another thread can fall into: after the loop's last look, before the return.
        static const int late_return_us = [] {
          const char* env = std::getenv("ZERO_TEST_MPI_WAIT_LATE_RETURN_US");
          return env != nullptr ? std::atoi(env) : 0;
        }();
        if (late_return_us > 0) std::this_thread::sleep_for(std::chrono::microseconds(late_return_us));
#endif
        return false;
      }
      sched_yield();  // ranks may outnumber cores: let the others run
    }
  }

  // ---- Failure handling
  void abort(const std::string& reason) {
    {
      std::lock_guard<std::mutex> lock(abort_mutex_);
      if (abort_requested_.load()) return;
      abort_reason_ = reason;
      abort_requested_.store(true);
    }
    {
      std::lock_guard<std::mutex> lock(window_mutex_);  // the progress thread sees it before its next step
    }
    window_cv_.notify_one();
    // Tell the others now if this thread may call MPI; otherwise the next call on the libzero thread does.
    if (may_call_mpi_now()) say_goodbye(reason);
  }

  std::string abort_reason() const {
    std::lock_guard<std::mutex> lock(abort_mutex_);
    return abort_reason_;
  }

  // Sends NOTICE to every rank still there (once) and pushes it out.
  // First it passes on the first notice it heard (a notice names the rank it is about), so that the rank whose
  // failure this one most likely stops because of is heard of before this one everywhere: MPI keeps the order of
  // one sender's messages, not across senders, and that rank's own notice may arrive after this one's. One relay,
  // not every notice heard: a cascade over N ranks then costs O(N) messages per rank. Only from the thread inside
  // libzero's calls, which owns the peers' records (abort() from another thread sends its own notice alone).
  // An abort requested earlier is the reason whatever the occasion (a destructor, an exit hook, a failure): its
  // notice may not have left yet (the thread that called zero_engine_abort may not call MPI, and the libzero
  // thread may have left its call before it saw the request).
  void say_goodbye(const std::string& occasion) {
    if (finalized_ || mpi_gone_ || ctl_ == MPI_COMM_NULL || goodbye_sent_.load()) return;
    const std::string reason = abort_requested_.load() ? abort_reason() : occasion;
    int first = -1;
    if (std::this_thread::get_id() == caller_.load())
      for (int r = 0; r < size_; ++r)
        if (r != rank_ && peers_[static_cast<size_t>(r)].heard != 0 &&
            (first < 0 || peers_[static_cast<size_t>(r)].heard < peers_[static_cast<size_t>(first)].heard))
          first = r;
    std::vector<CtlMsg> notices;
    if (first >= 0) {
      const Peer& p = peers_[static_cast<size_t>(first)];
      CtlMsg relay;
      relay.type = kNotice;
      relay.rank = first;
      relay.a = p.left_after;
      relay.b = p.left_open;
      copy_text(relay.text, p.reason);
      notices.push_back(relay);
    }
    CtlMsg m;
    m.type = kNotice;
    m.rank = rank_;
    m.a = completed_;
    m.b = lowest_open();
    copy_text(m.text, reason);
    notices.push_back(m);
    if (goodbye_sent_.exchange(true)) return;  // only now: had building the notices thrown, a later call sends them
    for (int r = 0; r < size_; ++r)
      if (r != rank_ && peers_[static_cast<size_t>(r)].left_after == UINT64_MAX)
        for (const CtlMsg& notice : notices) send(r, notice);
    flush_sends(1.0);
  }

  std::string diagnose(uint64_t sequence, double grace_s) {
    enter();
    InCall in(this);
    for (auto& p : peers_) p.replied = false;
    CtlMsg q;
    q.type = kQuery;
    q.rank = rank_;
    q.a = sequence;
    for (int r = 0; r < size_; ++r)
      if (r != rank_ && peers_[static_cast<size_t>(r)].left_after == UINT64_MAX) send(r, q);
    const auto begin = Clock::now();
    while (seconds_since(begin) < grace_s) {
      poll_control();
      bool all = true;
      for (int r = 0; r < size_; ++r)
        if (r != rank_ && !peers_[static_cast<size_t>(r)].replied &&
            peers_[static_cast<size_t>(r)].left_after == UINT64_MAX)
          all = false;
      if (all) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    std::string out = "What the other ranks are doing:";
    std::vector<int> silent;
    for (int r = 0; r < size_; ++r) {
      if (r == rank_) continue;
      const Peer& p = peers_[static_cast<size_t>(r)];
      if (p.left_after != UINT64_MAX) {
        out += " rank " + std::to_string(r) + " has stopped after collective #" + std::to_string(p.left_after) + " (" +
               p.reason + ");";
      } else if (p.replied) {
        if (p.reply.a != 0) {
          char seconds[32];
          std::snprintf(seconds, sizeof seconds, "%.1f", p.reply.seconds);
          out += " rank " + std::to_string(r) + " waits in collective #" + std::to_string(p.reply.a) + " (" +
                 p.reply.text + ") for " + seconds + " s;";
        } else {
          out += " rank " + std::to_string(r) + " answered from outside any collective, after collective #" +
                 std::to_string(p.reply.b) + ";";
        }
      } else {
        silent.push_back(r);
      }
    }
    if (!silent.empty()) {
      char within[32];
      std::snprintf(within, sizeof within, "%.1f", grace_s);
      out += std::string(" no answer within ") + within + " s from rank";
      out += silent.size() > 1 ? "s " : " ";
      for (size_t i = 0; i < silent.size(); ++i) out += (i ? ", " : "") + std::to_string(silent[i]);
      out +=
          ": not inside a libzero collective (busy in the framework's code, blocked elsewhere, or hung); the "
          "last collective every rank took part in is #" +
          std::to_string(completed_) + (completed_label_.empty() ? "" : " (" + completed_label_ + ")") + ";";
    }
    if (out.back() == ';') out.back() = '.';
    return out;
  }

  // ---- Teardown
  void finalize() {
    enter();
    {
      InCall in(this);
      poll_control();
      tell_pending_abort();  // an abort from another thread since enter(): before the control channel closes
      close_control(1.0);
      stop_progress_thread();
      if (window_) window_->free();
      if (hierarchy_) hierarchy_->free();
      if (node_ != MPI_COMM_NULL) MPI_Comm_free(&node_);
      MPI_Comm_free(&data_);
      MPI_Comm_free(&ctl_);
    }
    finalized_ = true;
    bool last_ours = false;
    {
      std::lock_guard<std::mutex> lock(g_mutex);
      g_live.erase(std::remove(g_live.begin(), g_live.end(), this), g_live.end());
      last_ours = g_we_initialized_mpi && g_live.empty();
    }
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (last_ours && !finalized) MPI_Finalize();
  }

  // Local. The MPI communicators stay (freeing one is collective); MPI_Finalize reclaims them.
  ~Backend() {
    stop_progress_thread();
    {
      std::lock_guard<std::mutex> lock(g_mutex);
      g_live.erase(std::remove(g_live.begin(), g_live.end(), this), g_live.end());
    }
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized || finalized_ || mpi_gone_) return;
    if (may_call_mpi_now()) {
      say_goodbye("it destroyed its communicator");
      close_control(0.5);
    }
  }

  // Called first thing in MPI_Finalize, or at exit: the last chance to tell the others.
  void last_goodbye(const std::string& reason) {
    stop_progress_thread();  // MPI_Finalize frees the window under it
    if (finalized_ || mpi_gone_) return;
    say_goodbye(reason);
    close_control(1.0);
    mpi_gone_ = true;
  }

 private:
  // Marks the thread inside the backend, so that abort() from another thread knows not to call MPI.
  // Leaving, it sends the notice of an abort requested meanwhile by a thread that saw in_call_ and left it to this
  // one (the wait loop may have returned just before the request). in_call_ and abort_requested_ are sequentially
  // consistent, each thread writing its own and then reading the other's: if abort() saw in_call_ set, this
  // destructor sees its request. An abort() that saw in_call_ clear and may not call MPI (another thread below
  // MPI_THREAD_MULTIPLE) leaves the notice to this thread's next entry here, the destroy or the exit hooks (an
  // aborted engine's calls fail in the core, so in practice the last two), which send it with the abort's reason.
  struct InCall {
    explicit InCall(Backend* b) : b_(b) { b_->in_call_.store(true); }
    ~InCall() {
      b_->in_call_.store(false);
      try {
        b_->tell_pending_abort();
      } catch (...) {  // a destructor: the next call or the teardown sends it
      }
    }
    Backend* b_;
  };

  void enter() {
    if (mpi_gone_) fail(ZERO_ERR_INVALID_STATE, "MPI has been finalized in this process; the communicator is gone");
    if (finalized_) fail(ZERO_ERR_INVALID_STATE, "the communicator was finalized (zero_comm_finalize)");
    if (g_provided == MPI_THREAD_FUNNELED) {
      int main_thread = 0;
      MPI_Is_thread_main(&main_thread);
      if (!main_thread)
        fail(ZERO_ERR_INVALID_STATE,
             "MPI was initialised with MPI_THREAD_FUNNELED, so only the thread that initialised it may call MPI, "
             "and this libzero call comes from another thread; initialise MPI with MPI_THREAD_SERIALIZED to call "
             "libzero from any one thread at a time");
    }
    caller_.store(std::this_thread::get_id());
    tell_pending_abort();
  }

  // The notice of an abort requested from another thread that could not send it (once: say_goodbye).
  void tell_pending_abort() {
    if (abort_requested_.load() && !goodbye_sent_.load()) say_goodbye(abort_reason());
  }

  // Never while the thread inside libzero's calls is in one, whatever the thread level: its wait loop sees the
  // abort and sends the notice itself, and the control state (peers, outbox) stays that thread's.
  bool may_call_mpi_now() const {
    if (in_call_.load()) return false;
    if (g_provided == MPI_THREAD_MULTIPLE) return true;
    if (g_provided == MPI_THREAD_FUNNELED) {
      int main_thread = 0;
      MPI_Is_thread_main(&main_thread);
      return main_thread != 0;
    }
    const std::thread::id caller = caller_.load();
    return caller == std::this_thread::get_id() || caller == std::thread::id();
  }

  // Why collective `sequence` can never complete: a rank stopped before it (empty: none) — after completing
  // earlier ones only, or with an earlier one started and never completed (collectives complete out of order: a
  // prefetch is waited for after later agreements), from which on nothing is certain. Called before a wait tests
  // its own collective, never after it completed here.
  // Of several such ranks, the one this rank heard of first: usually the cause, the others having stopped because
  // of it (a rank that learnt of a failure and then destroyed its communicator says only that).
  std::string stopped_peer(uint64_t sequence, const char* label) const {
    int first = -1;
    for (int r = 0; r < size_; ++r) {
      const Peer& p = peers_[static_cast<size_t>(r)];
      if (r == rank_ || p.left_after == UINT64_MAX) continue;
      if (sequence <= p.left_after && sequence < p.left_open) continue;
      if (first < 0 || p.heard < peers_[static_cast<size_t>(first)].heard) first = r;
    }
    if (first >= 0) {
      const int r = first;
      const Peer& p = peers_[static_cast<size_t>(r)];
      const std::string took = sequence > p.left_after
                                   ? "It took part in the collectives up to #" + std::to_string(p.left_after)
                                   : "It left collective #" + std::to_string(p.left_open) +
                                         " unfinished (and completed up to #" + std::to_string(p.left_after) + ")";
      return "rank " + std::to_string(r) + " has stopped: " + p.reason + ". " + took + ", so collective #" +
             std::to_string(sequence) + " (" + (label ? label : "") + ") cannot complete";
    }
    return {};
  }

  // The first collective started here and not completed (the window's ones the queue moved through count as
  // completed: this rank did its part); UINT64_MAX if none.
  uint64_t lowest_open() const {
    for (const auto& f : in_flight_)
      if (f.second.op == nullptr || !(f.second.op->shm && f.second.op->shm_done.load())) return f.first;
    return UINT64_MAX;
  }

  // Advances the window's collectives in start order, as far as the peers allow (a bounded amount of work per
  // call, so that the caller's wait loop keeps polling). A descriptor mismatch, found here or by the progress
  // thread, fails the wait in progress. While the progress thread holds the queue the caller does not wait for it.
  void progress_window(Op* waiting) {
    if (abort_requested_.load()) return;  // an aborted rank takes no further part
    std::unique_lock<std::mutex> lock(window_mutex_, std::try_to_lock);
    if (!lock.owns_lock()) return;
    if (window_failure_.empty()) step_window_locked(waiting);
    if (!window_failure_.empty()) {
      const std::string what = window_failure_;
      const zero_status_t status = window_failure_status_;
      window_queue_.clear();
      lock.unlock();
      // In one window every rank checks every descriptor, so every rank finds a mismatch at once. Across nodes, or
      // when a read failed, the ranks it touches see it: the others learn it from this rank's notice — sent before
      // the collectives are abandoned, so that it names the first this rank leaves unfinished.
      if (hierarchy_ || status != ZERO_ERR_MISMATCH) say_goodbye(what);
      abandon(waiting);
      fail(status, what);
    }
  }

  // With window_mutex_ held. Whether anything moved (a chunk, or a collective completed).
  bool step_window_locked(const Op* stop_after) {
    bool moved = false;
    while (!window_queue_.empty()) {
      Op* front = window_queue_.front();
      if (front->hier) {
        using HP = zero_mpi::Hierarchy::Progress;
        const zero_mpi::Hierarchy::Op before = front->hier_op;
        const HP p = hierarchy_->step(front->hier_op);
        moved |= front->hier_op.chunk != before.chunk || front->hier_op.phase != before.phase ||
                 front->hier_op.finals_done != before.finals_done || front->hier_op.exchanged != before.exchanged;
        if (p == HP::kMismatch || p == HP::kFailed) {
          window_failure_status_ = p == HP::kMismatch ? ZERO_ERR_MISMATCH : ZERO_ERR_COMM;
          window_failure_ = "collective #" + std::to_string(front->coll.sequence) + " (" + front->label +
                            "): " + (p == HP::kMismatch ? "the ranks are not in the same collective: " : "") +
                            hierarchy_->error();
          return moved;
        }
        if (p == HP::kWaiting) return moved;
      } else {
        const zero_mpi::NodeWindow::Op before = front->shm_op;
        const zero_mpi::NodeWindow::Progress p = window_->step(front->shm_op);
        moved |= front->shm_op.offset != before.offset || front->shm_op.copied != before.copied ||
                 front->shm_op.phase != before.phase || front->shm_op.peer != before.peer;
        if (p == zero_mpi::NodeWindow::Progress::kMismatch) {
          window_failure_status_ = ZERO_ERR_MISMATCH;
          window_failure_ = "collective #" + std::to_string(front->coll.sequence) + " (" + front->label +
                            "): the ranks are not in the same collective: " + window_->mismatch();
          return moved;
        }
        if (p == zero_mpi::NodeWindow::Progress::kFailed) {
          window_failure_status_ = ZERO_ERR_COMM;
          window_failure_ =
              "collective #" + std::to_string(front->coll.sequence) + " (" + front->label + "): " + window_->failure();
          return moved;
        }
        if (p == zero_mpi::NodeWindow::Progress::kWaiting) return moved;
      }
      window_queue_.pop_front();
      front->shm_done.store(true, std::memory_order_release);
      moved = true;
      if (front == stop_after) return moved;
    }
    return moved;
  }

  // ---- The progress thread: moves the window's queue while the caller computes. It makes no MPI call and
  // touches only the window and the buffers of collectives in flight (which the engine leaves alone until their
  // wait). When peers are behind it backs off from spinning to short sleeps, so that an idle job costs no core.
  // Lazily, with the first collective through the window; where the thread cannot be made (a container's thread
  // limit), the waits move the queue, as without it.
  void start_progress_thread() {
    if (progress_thread_.joinable()) return;
    try {
      progress_thread_ = std::thread([this] { progress_loop(); });
    } catch (const std::system_error&) {
      use_progress_thread_ = false;
    }
  }

  void progress_loop() {
    int idle = 0;
    std::unique_lock<std::mutex> lock(window_mutex_);
    while (!stop_progress_) {
      // After an abort (zero_engine_abort, or this rank's own timeout) this rank takes no further part: what is
      // queued stays as it is, and the thread sleeps until it is stopped.
      if (window_queue_.empty() || !window_failure_.empty() || abort_requested_.load()) {
        idle = 0;
        window_cv_.wait(lock);
        continue;
      }
      const bool moved = step_window_locked(nullptr);
      if (moved) {
        idle = 0;
        continue;
      }
      ++idle;
      if (idle < 64) {
        lock.unlock();
        std::this_thread::yield();
        lock.lock();
      } else {  // a new collective wakes it at once
        window_cv_.wait_for(lock, std::chrono::microseconds(idle < 1024 ? 20 : 500));
      }
    }
  }

  // Before the window goes (zero_comm_finalize, MPI_Finalize, the backend's end).
  void stop_progress_thread() {
    if (!progress_thread_.joinable()) return;
    {
      std::lock_guard<std::mutex> lock(window_mutex_);
      stop_progress_ = true;
    }
    window_cv_.notify_one();
    progress_thread_.join();
  }

  void complete(Op* op) {
    std::unique_ptr<Op> owned(op);
    if (waiting_ == op) waiting_ = nullptr;
    if (op->coll.kind == ZERO_COLL_REDUCE_SCATTER && !op->shm)
      zero::sum_blocks_in_rank_order(op->coll.buf, op->coll.count, size_, rank_, op->coll.dtype);
    // The highest completed, not the last: collectives started together (a group, fetches ahead) may complete out
    // of order, and a notice must not say this rank left before one it took part in.
    if (op->coll.sequence >= completed_) {
      completed_ = op->coll.sequence;
      completed_label_ = op->label;
    }
    in_flight_.erase(op->coll.sequence);
  }

  // A collective given up while in flight: MPI cannot cancel it, so its request (and the caller's buffer) stay.
  void abandon(Op* op) {
    in_flight_.clear();  // after a failure nothing more completes here (the engine stops using the communicator)
    {
      std::lock_guard<std::mutex> lock(window_mutex_);
      window_queue_.clear();
    }
    abandoned_.emplace_back(op);
  }

  void post_inbox() {
    check(MPI_Irecv(&inbox_, sizeof inbox_, MPI_BYTE, MPI_ANY_SOURCE, MPI_ANY_TAG, ctl_, &inbox_request_), "MPI_Irecv");
  }

  // The outbox has its own lock: an abort() from another thread may send while this rank's thread enters a call.
  void send(int to, const CtlMsg& m) {
    std::lock_guard<std::mutex> lock(outbox_mutex_);
    outbox_.emplace_back();
    Outgoing& o = outbox_.back();
    o.msg = m;
    if (MPI_Isend(&o.msg, sizeof o.msg, MPI_BYTE, to, m.type, ctl_, &o.request) != MPI_SUCCESS) outbox_.pop_back();
  }

  void flush_sends(double timeout_s) {
    const auto begin = Clock::now();
    while (!complete_sends()) {
      if (seconds_since(begin) >= timeout_s) break;
      sched_yield();
    }
  }

  // Whether the outbox is empty afterwards.
  bool complete_sends() {
    std::lock_guard<std::mutex> lock(outbox_mutex_);
    for (auto it = outbox_.begin(); it != outbox_.end();) {
      int done = 0;
      MPI_Test(&it->request, &done, MPI_STATUS_IGNORE);
      it = done ? outbox_.erase(it) : std::next(it);
    }
    return outbox_.empty();
  }

  void poll_control() {
    complete_sends();
    for (;;) {
      int arrived = 0;
      MPI_Status status;
      check(MPI_Test(&inbox_request_, &arrived, &status), "MPI_Test (control)");
      if (!arrived) return;
      const CtlMsg m = inbox_;
      post_inbox();
      if (m.rank < 0 || m.rank >= size_ || m.rank == rank_) continue;
      Peer& p = peers_[static_cast<size_t>(m.rank)];
      if (m.type == kNotice) {
        p.left_after = std::min(p.left_after, m.a);
        p.left_open = std::min(p.left_open, m.b);
        p.reason = std::string(m.text, strnlen(m.text, sizeof m.text));
        if (p.heard == 0) p.heard = ++heard_;
      } else if (m.type == kQuery) {
        CtlMsg r;
        r.type = kReply;
        r.rank = rank_;
        // The collective this rank is waiting for, if any (others may be in flight: a group, fetches ahead).
        const auto it = waiting_ != nullptr ? in_flight_.find(waiting_->coll.sequence) : in_flight_.end();
        const bool waiting = it != in_flight_.end();
        r.a = waiting ? it->first : 0;
        r.b = completed_;
        r.seconds = waiting ? seconds_since(it->second.since) : 0.0;
        copy_text(r.text, waiting ? it->second.label : completed_label_);
        send(m.rank, r);
      } else if (m.type == kReply) {
        p.replied = true;
        p.reply = m;
      }
    }
  }

  // Stops listening: the pending receive is cancelled, outgoing notices get a moment to leave.
  void close_control(double timeout_s) {
    if (control_closed_) return;
    control_closed_ = true;
    flush_sends(timeout_s);
    MPI_Cancel(&inbox_request_);
    MPI_Wait(&inbox_request_, MPI_STATUS_IGNORE);
  }

  struct Outgoing {
    CtlMsg msg;
    MPI_Request request = MPI_REQUEST_NULL;
  };

  MPI_Comm data_, ctl_;
  int rank_ = 0, size_ = 1, local_size_ = 1;
  std::string error_;
  std::vector<Peer> peers_;
  CtlMsg inbox_;
  MPI_Request inbox_request_ = MPI_REQUEST_NULL;
  std::list<Outgoing> outbox_;  // MPI_Isend keeps pointing at each message: a list never moves them
  std::mutex outbox_mutex_;
  uint64_t completed_ = 0;
  std::string completed_label_;
  uint64_t heard_ = 0;  // notices of stopped peers heard so far
  // Collectives started and not completed, by sequence (several when the engine starts a group).
  struct InFlight {
    std::string label;
    Clock::time_point since;
    const Op* op = nullptr;
  };
  std::map<uint64_t, InFlight> in_flight_;
  const Op* waiting_ = nullptr;  // the collective last waited for, until it completes
  // Every rank on one node: reduce-scatters and all-gathers go through this window (freed by finalize; a local
  // destroy leaves it to MPI_Finalize, as it does the communicators).
  std::unique_ptr<zero_mpi::NodeWindow> window_;
  // The window's collectives started and not moved through yet, in start order (the chunk protocol's order),
  // moved by waits and by the progress thread, under window_mutex_.
  std::deque<Op*> window_queue_;
  std::mutex window_mutex_;
  std::condition_variable window_cv_;
  // Several nodes of equal size, each holding consecutive ranks: reduce-scatters and all-gathers through each
  // node's window and between the nodes over MPI (hierarchy.hpp), on the node communicator node_.
  std::unique_ptr<zero_mpi::Hierarchy> hierarchy_;
  MPI_Comm node_ = MPI_COMM_NULL;
  std::string window_failure_;  // a descriptor mismatch or a failed message: every later wait fails with it
  zero_status_t window_failure_status_ = ZERO_ERR_MISMATCH;
  bool use_progress_thread_ = false;
  bool stop_progress_ = false;
  std::thread progress_thread_;
  std::vector<std::unique_ptr<Op>> abandoned_;
  std::atomic<bool> abort_requested_{false};
  mutable std::mutex abort_mutex_;
  std::string abort_reason_;
  std::atomic<bool> in_call_{false};
  std::atomic<std::thread::id> caller_{};  // read by abort() from other threads
  std::atomic<bool> goodbye_sent_{false};  // by whichever thread says it first
  bool control_closed_ = false, finalized_ = false, mpi_gone_ = false;
};

void say_goodbye_all(const std::string& reason) {
  std::vector<Backend*> live;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    live = g_live;
  }
  for (Backend* b : live) b->last_goodbye(reason);
}

Backend* as_backend(void* user_data) { return static_cast<Backend*>(user_data); }

extern "C" {

zero_status_t op_run(void* ud, const zero_collective_t* coll) {
  Backend* b = as_backend(ud);
  return b->guarded([&] {
    Op* op = b->start(*coll);
    while (!b->wait(op, 3600.0)) {
    }
  });
}

zero_status_t op_start(void** out_request, void* ud, const zero_collective_t* coll) {
  Backend* b = as_backend(ud);
  return b->guarded([&] { *out_request = b->start(*coll); });
}

zero_status_t op_wait(int32_t* out_done, void* ud, void* request, double timeout_s) {
  Backend* b = as_backend(ud);
  return b->guarded([&] { *out_done = b->wait(static_cast<Op*>(request), timeout_s) ? 1 : 0; });
}

const char* op_error(void* ud) { return as_backend(ud)->error(); }

void op_abort(void* ud, const char* reason) {
  try {
    as_backend(ud)->abort(reason != nullptr ? reason : "aborted");
  } catch (...) {
  }
}

zero_status_t op_diagnose(char* out, size_t capacity, void* ud, uint64_t sequence, double grace_s) {
  Backend* b = as_backend(ud);
  return b->guarded([&] {
    const std::string text = b->diagnose(sequence, grace_s);
    if (capacity == 0) return;
    const size_t n = std::min(text.size(), capacity - 1);
    std::memcpy(out, text.data(), n);
    out[n] = '\0';
  });
}

zero_status_t op_finalize(void* ud) {
  Backend* b = as_backend(ud);
  return b->guarded([&] { b->finalize(); });
}

void op_destroy(void* ud) {
  try {
    delete as_backend(ud);
  } catch (...) {
  }
}

}  // extern "C"

}  // namespace

extern "C" ZERO_API zero_status_t zero_mpi_backend_open(zero_comm_ops_t* out_ops, void** out_user_data,
                                                        int64_t mpi_comm, char* error_text, size_t capacity) {
  auto report = [&](const std::string& message) {
    if (error_text != nullptr && capacity > 0) {
      const size_t n = std::min(message.size(), capacity - 1);
      std::memcpy(error_text, message.data(), n);
      error_text[n] = '\0';
    }
  };
  if (out_ops == nullptr || out_user_data == nullptr || out_ops->struct_size < sizeof(zero_comm_ops_t)) {
    report("zero_mpi_backend_open: bad arguments (a libzero.so / libzero-mpi.so version mismatch?)");
    return ZERO_ERR_INVALID_ARGUMENT;
  }
  std::lock_guard<std::mutex> lock(g_mutex);
  MPI_Comm dup_data = MPI_COMM_NULL, dup_ctl = MPI_COMM_NULL;
  try {
    int initialized = 0, finalized = 0;
    MPI_Initialized(&initialized);
    MPI_Finalized(&finalized);
    if (finalized) fail(ZERO_ERR_INVALID_STATE, "MPI has already been finalised in this process; it cannot restart");
    if (!initialized) {
      int provided = 0;
      check(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided), "MPI_Init_thread");
      g_we_initialized_mpi = true;
    }
    check(MPI_Query_thread(&g_provided), "MPI_Query_thread");
    if (g_provided < MPI_THREAD_FUNNELED)
      fail(ZERO_ERR_UNSUPPORTED,
           "MPI was initialised with MPI_THREAD_SINGLE (MPI_Init does that), but libzero runs OpenMP threads beside "
           "MPI and needs at least MPI_THREAD_FUNNELED: initialise MPI with MPI_Init_thread(&argc, &argv, "
           "MPI_THREAD_FUNNELED, &provided), or MPI_THREAD_SERIALIZED to call libzero from any one thread");
    if (g_provided == MPI_THREAD_FUNNELED) {
      int main_thread = 0;
      MPI_Is_thread_main(&main_thread);
      if (!main_thread)
        fail(ZERO_ERR_INVALID_STATE,
             "MPI was initialised with MPI_THREAD_FUNNELED and zero_comm_create_mpi is called from another thread "
             "than the one that initialised it; initialise MPI with MPI_THREAD_SERIALIZED");
    }
    MPI_Comm user = mpi_comm == ZERO_MPI_COMM_WORLD ? MPI_COMM_WORLD : MPI_Comm_f2c(static_cast<MPI_Fint>(mpi_comm));
    if (user == MPI_COMM_NULL) fail(ZERO_ERR_INVALID_ARGUMENT, "mpi_comm is MPI_COMM_NULL");
    check(MPI_Comm_dup(user, &dup_data), "MPI_Comm_dup");
    check(MPI_Comm_dup(user, &dup_ctl), "MPI_Comm_dup");
    MPI_Comm_set_errhandler(dup_data, MPI_ERRORS_RETURN);
    MPI_Comm_set_errhandler(dup_ctl, MPI_ERRORS_RETURN);
    install_hooks();
    auto backend = std::make_unique<Backend>(dup_data, dup_ctl);
    zero_comm_ops_t ops;
    std::memset(&ops, 0, sizeof ops);
    ops.struct_size = sizeof ops;
    ops.rank = backend->rank();
    ops.size = backend->size();
    ops.local_size = backend->local_size();
    ops.flags = ZERO_COMM_DETERMINISTIC;
    ops.run = op_run;
    ops.start = op_start;
    ops.wait = op_wait;
    ops.error_message = op_error;
    ops.abort = op_abort;
    ops.diagnose = op_diagnose;
    ops.finalize = op_finalize;
    ops.destroy = op_destroy;
    std::memcpy(out_ops, &ops, sizeof ops);
    g_live.push_back(backend.get());
    *out_user_data = backend.release();
    return ZERO_OK;
  } catch (const Failure& f) {
    if (dup_data != MPI_COMM_NULL) MPI_Comm_free(&dup_data);
    if (dup_ctl != MPI_COMM_NULL) MPI_Comm_free(&dup_ctl);
    report(f.message);
    return f.status;
  } catch (const std::bad_alloc&) {
    report("out of memory");
    return ZERO_ERR_OUT_OF_MEMORY;
  }
}
