#include "comm/shm_communicator.hpp"

#include <sched.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <list>
#include <mutex>
#include <system_error>
#include <thread>
#include <tuple>
#include <vector>

#include "comm/cross_node.hpp"
#include "comm/node_window.hpp"
#include "comm/progress_policy.hpp"
#include "comm/shm_segment.hpp"
#include "util/error.hpp"

namespace zero {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

size_t half_bytes_from_env() {
  const char* env = std::getenv("ZERO_SHM_HALF_BYTES");
  const unsigned long long v = env != nullptr ? std::strtoull(env, nullptr, 10) : 0;
  return v >= 4096 && v <= (1ull << 30) ? static_cast<size_t>(v) : size_t{512} << 10;
}

// A byte count from the environment: `fallback` when unset, a configuration error when it is not a number of at most
// `most` bytes.
size_t bytes_from_env(const char* name, size_t fallback, uint64_t most) {
  const char* env = std::getenv(name);
  if (env == nullptr || *env == '\0') return fallback;
  char* end = nullptr;
  errno = 0;
  const unsigned long long v = std::strtoull(env, &end, 10);
  if (*env < '0' || *env > '9' || *end != '\0' || errno != 0 || v > most)
    fail(ZERO_ERR_CONFIG, std::string(name) + " is '" + env + "': a number of bytes, at most " + std::to_string(most));
  return static_cast<size_t>(v);
}

// Each rank's share of the shared arena: ZERO_SHM_ARENA_BYTES, else half of /dev/shm's free space over the ranks
// (address space: a rank commits only what its buckets take, and the other half stays free for what else uses
// /dev/shm, a data loader's workers), at most 64 GiB.
size_t arena_bytes_from_env(int ranks) {
  struct statvfs fs {};
  uint64_t fallback = 0;
  if (statvfs("/dev/shm", &fs) == 0)
    fallback = std::min<uint64_t>(
        static_cast<uint64_t>(fs.f_bavail) * fs.f_frsize / 2 / static_cast<uint64_t>(std::max(ranks, 1)),
        uint64_t{64} << 30);
  return bytes_from_env("ZERO_SHM_ARENA_BYTES", static_cast<size_t>(fallback), uint64_t{1} << 40);
}

size_t direct_min_bytes_from_env() {
  return bytes_from_env("ZERO_SHM_DIRECT_MIN_BYTES", NodeWindow::kDirectMinBytes, uint64_t{1} << 40);
}

// Rank 0's choice is the job's (the segment ignores the others'); every rank checks its own, so that a job whose
// ranks share a bad value fails on all of them at once rather than on rank 0 while the others wait to join.
ShmSegment::Settings settings_from_env(int ranks, bool one_node) {
  ShmSegment::Settings s;
  s.half_bytes = half_bytes_from_env();
  s.arena_bytes = one_node ? arena_bytes_from_env(ranks) : 0;  // the cross-node paths stage through the halves
  s.direct_min_bytes = direct_min_bytes_from_env();
  return s;
}

bool env_is_zero(const char* name) {
  const char* env = std::getenv(name);
  return env != nullptr && std::strcmp(env, "0") == 0;
}

class ShmCommunicator;

// The communicators of this process not yet finalized or destroyed: at exit each tells its peers, so that a rank
// still waiting for this one fails at once instead of after its timeout.
std::mutex g_live_mutex;
std::vector<ShmCommunicator*>& live() {
  static auto* communicators = new std::vector<ShmCommunicator*>();  // never freed: exit handlers read it
  return *communicators;
}

// Ranks per node of a job over several nodes (every node holds the same number of consecutive ranks), or the whole
// job on one.
int locals_of(int size, const ShmNodes* nodes) { return nodes != nullptr ? nodes->ranks_per_node : size; }
std::string segment_name(const std::string& name, int rank, const ShmNodes* nodes) {
  return nodes != nullptr ? name + "-node" + std::to_string(rank / nodes->ranks_per_node) : name;
}

class ShmCommunicator final : public Communicator {
 public:
  ShmCommunicator(const std::string& name, int rank, int size, double join_timeout_s, const ShmNodes* nodes)
      : Communicator(rank, size, locals_of(size, nodes), true),
        segment_(segment_name(name, rank, nodes), rank % locals_of(size, nodes), locals_of(size, nodes),
                 settings_from_env(locals_of(size, nodes), nodes == nullptr), join_timeout_s),
        owner_(getpid()) {
    const int locals = locals_of(size, nodes), local = rank % locals;
    // One deadline for the whole setup, as the caller's timeout promises.
    const auto deadline =
        Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(join_timeout_s));
    const auto left = [&] { return std::max(0.0, std::chrono::duration<double>(deadline - Clock::now()).count()); };
    try {
      window_ = std::make_shared<NodeWindow>(local, locals, segment_.half_bytes(), segment_.slots(), nullptr);
      window_->set_direct_min_bytes(segment_.direct_min_bytes());
      window_->reset_line();
      window_->publish_probe();
      segment_.barrier(2, left(), "publishing the window");
      // Ranks in another pid namespace (containers sharing /dev/shm) cannot be asked whether they still live: then
      // a rank that dies without a word is found by the timeout only.
      segment_.set_process_checks(segment_.peers_visible());
      // Single copy only if every rank could read every peer.
      const bool mine = !env_is_zero("ZERO_SHM_SINGLE_COPY") && locals > 1 && window_->probe_peers();
      agree_single_copy(mine, left());
      if (locals < size) connect_nodes(name, rank / locals, size / locals, *nodes, left());
    } catch (const std::exception& e) {
      // The peers that joined must not wait for this rank until their timeout.
      segment_.stop(ShmRankState::kStopped, 0, std::string("it failed while setting up the communicator: ") + e.what());
      throw;
    }
    use_progress_thread_ = size > 1 && want_progress_thread(locals, "ZERO_SHM_PROGRESS_THREAD");
    static std::once_flag hook;
    std::call_once(hook, [] { std::atexit(tell_peers_at_exit); });
    std::lock_guard<std::mutex> lock(g_live_mutex);
    live().push_back(this);
  }

  ~ShmCommunicator() override {
    {
      std::lock_guard<std::mutex> lock(g_live_mutex);
      live().erase(std::remove(live().begin(), live().end(), this), live().end());
    }
    stop_progress_thread();
    // A child forked from the rank (it shares the mapping) speaks for no rank.
    if (!finalized() && getpid() == owner_) {
      segment_.stop(ShmRankState::kStopped, completed_.load(), "it destroyed its communicator");
      if (cross_) cross_->tell_peers(completed_.load(), "it destroyed its communicator");
    }
  }

  bool can_time_out() const override { return true; }

  std::shared_ptr<Allocator> shared_allocator() override {
    return window_->single_copy() && !cross_ ? segment_.arena() : nullptr;
  }

  // The job's rank of this node's segment rank r (the segment holds one node's ranks).
  int job_rank(int r) const { return rank() - segment_.rank() + r; }

  bool wait(Request request, double timeout_s) override {
    Op* op = static_cast<Op*>(request);
    // What the peers read of this rank until the collective completes or fails: also while this rank diagnoses
    // its own timeout (the wait returns first), so that ranks timing out together name each other's collective.
    segment_.set_waiting(op->coll.sequence, op->coll.label);
    struct NotWaitingOnFailure {
      ShmSegment& segment;
      bool armed = true;
      ~NotWaitingOnFailure() {
        if (armed) segment.set_waiting(0, "");
      }
    } not_waiting{segment_};
    const auto begin = Clock::now();
    auto checked = begin, polled = begin;
    for (int spins = 0;; ++spins) {
      // Every wait moves the queue, whatever it waits for, so ranks that wait in different orders never wait for
      // each other.
      progress();
      if (aborted_here_.load()) {
        const std::string why = "the communicator was aborted on this rank: " + abort_reason();
        abandon(why);
        fail(ZERO_ERR_ABORTED, why);
      }
      // Before the completion: a rank that stopped before this collective counts it as failed, so this one must
      // too, even when the data it had already put in the window let the collective complete here.
      const bool check_processes = Clock::now() - checked > std::chrono::milliseconds(100);
      if (check_processes) checked = Clock::now();
      // The link moves only inside collectives: a rank waiting on its own machine's ranks still answers the other
      // machines' questions.
      if (cross_ && Clock::now() - polled > std::chrono::milliseconds(10)) {
        cross_->poll();
        polled = Clock::now();
      }
      std::string stopped = stopped_peer(op->coll.sequence, op->coll.label, check_processes);
      bool heard = false;  // from another node
      if (stopped.empty() && cross_) {
        // A rank of this node that died says nothing: look at the processes before taking another node's word
        // (which may be a consequence of that death) for the cause.
        const std::string relayed = cross_->stopped_peer(op->coll.sequence, op->coll.label, false);
        if (!relayed.empty()) {
          stopped = stopped_peer(op->coll.sequence, op->coll.label, true);
          heard = stopped.empty();
          if (heard) stopped = relayed;
        }
      }
      if (!stopped.empty()) {
        abandon(stopped);
        if (cross_) {
          // This node's ranks see another node's only through this rank, and the other nodes see this node's only
          // through their counterparts: both hear it from here.
          if (heard) segment_.stop(ShmRankState::kStopped, completed_.load(), stopped);
          cross_->tell_peers(completed_.load(), stopped);
        }
        fail(ZERO_ERR_REMOTE, stopped);
      }
      if (op->done.load(std::memory_order_acquire)) {
        forget(op);
        return true;
      }
      if (seconds_since(begin) >= timeout_s) {
        not_waiting.armed = false;
        return false;
      }
      // Ranks may outnumber cores: let the others run, and after a while stop spinning.
      if (spins < 4096)
        sched_yield();
      else
        std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

  // Every rank's line is in the segment. A rank that is not inside a collective gets the grace period to arrive
  // (it may only be late), as the MPI module's question does; then the lines say what each does. Across machines,
  // the column peers are asked for their machines' lines (again while some rank there is not settled), so that
  // ranks timing out together on different machines all wait out the grace period and all name the one that hangs.
  std::string diagnose(uint64_t sequence, double grace_s) override {
    const auto begin = Clock::now();
    auto asked = begin - std::chrono::seconds(1);
    const int locals = segment_.size(), node = rank() / locals, nodes = size() / locals;
    while (seconds_since(begin) < grace_s) {
      bool all = true;
      for (int r = 0; r < locals && all; ++r) all = r == segment_.rank() || segment_.settled(r, sequence);
      if (cross_) {
        cross_->poll();
        for (int n = 0; n < nodes && all; ++n) all = n == node || cross_->machine(n, sequence).settled;
        if (!all && seconds_since(asked) >= 0.1) {
          cross_->ask(sequence);
          asked = Clock::now();
        }
      }
      if (all) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    std::string out = "What the other ranks are doing:";
    for (int n = 0; n < (cross_ ? nodes : 1); ++n) {
      if (!cross_ || n == node) {
        for (int r = 0; r < locals; ++r)
          if (r != segment_.rank()) out += segment_.describe(r, job_rank(r));
        continue;
      }
      const int column_peer = n * locals + segment_.rank();
      const CrossNode::Machine m = cross_->machine(n, sequence);
      const std::string notice = cross_->notice(n);
      if (m.answered) {
        out += m.lines;
      } else if (const size_t space = notice.find(' '); space != std::string::npos) {
        out += " rank " + std::to_string(column_peer) + " has stopped after collective #" + notice.substr(0, space) +
               " (" + notice.substr(space + 1) + ");";
      } else {
        char text[320];
        std::snprintf(text, sizeof text,
                      " rank %d: not inside a libzero collective, or its machine is unreachable (asked from here, it "
                      "did not answer within %.1f s);",
                      column_peer, grace_s);
        out += text;
      }
      if (!m.answered && locals > 1) {
        std::string others;
        for (int r = n * locals; r < (n + 1) * locals; ++r)
          if (r != column_peer) others += (others.empty() ? "" : ", ") + std::to_string(r);
        out += (locals > 2 ? " ranks " : " rank ") + others + ": not known here (that machine answers through rank " +
               std::to_string(column_peer) + ");";
      }
    }
    if (out.back() == ';') out.back() = '.';
    return out;
  }

  // This machine's lines, every rank's, for a column peer that asks (with the link's lock held).
  CrossNode::Machine describe_machine(uint64_t sequence) const {
    CrossNode::Machine m;
    m.answered = m.settled = true;
    for (int r = 0; r < segment_.size(); ++r) {
      m.settled = m.settled && segment_.settled(r, sequence);
      m.lines += segment_.describe(r, job_rank(r));
    }
    return m;
  }

  void tell_peers_exiting() {
    if (getpid() != owner_) return;
    segment_.stop(ShmRankState::kStopped, completed_.load(), "this process is exiting");
    if (cross_) cross_->tell_peers(completed_.load(), "this process is exiting");
  }

 private:
  struct Op {
    Collective coll;
    NodeWindow::Op window_op;
    CrossNode::Op cross_op;  // with cross_: every collective goes through it
    std::atomic<bool> done{false};
  };

  static void tell_peers_at_exit() {
    std::lock_guard<std::mutex> lock(g_live_mutex);
    for (ShmCommunicator* c : live()) c->tell_peers_exiting();
  }

  // Single copy is on when every rank's probe worked.
  void agree_single_copy(bool mine, double timeout_s) {
    segment_.set_vote(mine ? 1 : 0);
    segment_.barrier(3, timeout_s, "probing single copy");
    bool all = true;
    for (int r = 0; r < segment_.size(); ++r) all = all && segment_.peer(r).vote == 1;
    segment_.barrier(4, timeout_s, "agreeing on single copy");  // nobody reads a probe word after this
    window_->set_single_copy(all, "ZERO_SHM_SINGLE_COPY=0");
    // The arena is read in place on the single-copy path only (the halves copy whatever the buffer).
    if (all && segment_.arena()) {
      const std::shared_ptr<SharedArena>& arena = segment_.arena();
      window_->set_arena(arena->share(0), arena->share_bytes(), arena);
    }
  }

  Request do_start(const Collective& c) override {
    const bool float_type = c.type == ElemType::kF32 || c.type == ElemType::kBF16 || c.type == ElemType::kF16;
    if (c.kind == CollKind::kReduceScatter && !float_type)
      fail(ZERO_ERR_INVALID_ARGUMENT, c.label + ": a reduce-scatter of a non-float dtype");
    if (c.kind == CollKind::kAllReduce && c.type != ElemType::kF32 && c.type != ElemType::kF64 &&
        c.type != ElemType::kI64)
      fail(ZERO_ERR_UNSUPPORTED, c.label + ": the shared-memory communicator all-reduces fp32, fp64 and int64 only");
    if (c.kind == CollKind::kBroadcast && (c.root < 0 || c.root >= size()))
      fail(ZERO_ERR_INVALID_ARGUMENT, c.label + ": broadcast root " + std::to_string(c.root) + " out of range");
    ops_.push_back(std::make_unique<Op>());
    Op* op = ops_.back().get();
    op->coll = c;
    if (cross_)
      op->cross_op = cross_->begin(c.sequence, static_cast<int32_t>(c.kind), static_cast<int32_t>(c.type), c.buf,
                                   c.count, elem_size(c.type), static_cast<int32_t>(c.op), c.root);
    else
      op->window_op = window_->begin(c.sequence, static_cast<int32_t>(c.kind), static_cast<int32_t>(c.type), c.buf,
                                     c.count, elem_size(c.type), static_cast<int32_t>(c.op), c.root);
    if (!cross_ && c.kind == CollKind::kReduceScatter) op->window_op.sink = c.sink;
    if (use_progress_thread_) start_progress_thread();
    {
      std::lock_guard<std::mutex> lock(queue_mutex_);
      queue_.push_back(op);
    }
    if (use_progress_thread_) queue_cv_.notify_one();
    return op;
  }

  void do_abort(const std::string& reason) override {
    aborted_here_.store(true);
    segment_.stop(ShmRankState::kStopped, completed_.load(), reason);
    if (cross_) cross_->tell_peers(completed_.load(), reason);
    queue_cv_.notify_one();
  }

  // The agreement before it has made every rank call this: nothing is in flight, nobody waits for this rank.
  void do_finalize() override {
    stop_progress_thread();
    segment_.stop(ShmRankState::kFinalized, completed_.load(), "it finalized its communicator");
    if (cross_) cross_->free();
  }

  // A peer that will not take part in collective `sequence`: it stopped (or finalized) before it, or its process
  // ended before completing it. Empty if none.
  std::string stopped_peer(uint64_t sequence, const std::string& label, bool check_processes) const {
    for (int r = 0; r < segment_.size(); ++r) {
      if (r == segment_.rank()) continue;
      const ShmSegment::PeerView p = segment_.peer(r);
      std::string why;
      uint64_t after = 0;
      if ((p.state == ShmRankState::kStopped || p.state == ShmRankState::kFinalized) && p.stopped_after < sequence) {
        why = p.reason;
        after = p.stopped_after;
      } else if (check_processes && p.completed < sequence && segment_.peer_process_gone(r)) {
        after = segment_.peer(r).completed;  // again: it may have completed the collective just before it went
        if (after >= sequence) continue;
        why = "its process (pid " + std::to_string(p.pid) + ") ended without a word (killed by a signal?)";
      } else {
        continue;
      }
      return stopped_rank_message(job_rank(r), why, after, sequence, label);
    }
    return "";
  }

  // Moves the queue as far as the peers allow (the progress thread may hold it: then the caller does not wait
  // for it). A failure found here or by the progress thread fails the wait.
  void progress() {
    if (aborted_here_.load()) return;
    std::unique_lock<std::mutex> lock(queue_mutex_, std::try_to_lock);
    if (!lock.owns_lock()) return;
    if (failure_.empty()) step_locked();
    if (failure_.empty()) return;
    const std::string what = failure_;
    const zero_status_t status = failure_status_;
    const uint64_t sequence = failure_sequence_;
    const std::string label = failure_label_;
    queue_.clear();
    lock.unlock();
    // A single-copy read fails when the peer read from has died: then that peer is the cause, named as such.
    if (status == ZERO_ERR_COMM) {
      const std::string stopped = stopped_peer(sequence, label, true);
      if (!stopped.empty()) fail(ZERO_ERR_REMOTE, stopped);
    }
    fail(status, what);
  }

  // With queue_mutex_ held. Whether anything moved.
  bool step_locked() {
    bool moved = false;
    while (!queue_.empty()) {
      Op* front = queue_.front();
      if (cross_) {
        if (!step_cross_locked(front, moved)) return moved;
        continue;
      }
      const NodeWindow::Op before = front->window_op;
      const NodeWindow::Progress p = window_->step(front->window_op);
      moved |= front->window_op.offset != before.offset || front->window_op.copied != before.copied ||
               front->window_op.phase != before.phase || front->window_op.peer != before.peer;
      if (p == NodeWindow::Progress::kMismatch || p == NodeWindow::Progress::kFailed) {
        failure_status_ = p == NodeWindow::Progress::kMismatch ? ZERO_ERR_MISMATCH : ZERO_ERR_COMM;
        failure_ =
            "collective #" + std::to_string(front->coll.sequence) + " (" + front->coll.label + "): " +
            (p == NodeWindow::Progress::kMismatch ? "the ranks are not in the same collective: " + window_->mismatch()
                                                  : window_->failure());
        failure_sequence_ = front->coll.sequence;
        failure_label_ = front->coll.label;
        // A mismatch every rank finds in its own window; a failed read only this one: the others learn it now,
        // from whichever thread found it (stop() takes no lock), unless a peer that stopped is the cause.
        if (p == NodeWindow::Progress::kFailed && stopped_peer(failure_sequence_, failure_label_, true).empty())
          segment_.stop(ShmRankState::kStopped, completed_.load(), failure_);
        return moved;
      }
      if (p == NodeWindow::Progress::kWaiting) return moved;
      complete_front(front);
      moved = true;
    }
    return moved;
  }

  void complete_front(Op* front) {
    queue_.pop_front();
    // In start order: the highest completed is also every one before it.
    completed_.store(front->coll.sequence);
    segment_.set_completed(front->coll.sequence);
    front->done.store(true, std::memory_order_release);
  }

  // The front collective of a job over several nodes, with queue_mutex_ held: false while it waits or once it
  // failed. A failure is seen first by the ranks it touches (a column, or one node's window), so this rank tells
  // both: its line in the segment (its node's ranks) and its column peers (their nodes, through theirs).
  bool step_cross_locked(Op* front, bool& moved) {
    const CrossNode::Op& op = front->cross_op;
    const auto before = std::make_tuple(op.phase, op.transfers_done, op.gather.chunk, op.gather.phase,
                                        op.gather.finals_done, op.gather.exchanged, op.local.offset, op.local.copied);
    const CrossNode::Progress p = cross_->step(front->cross_op);
    moved |= before != std::make_tuple(op.phase, op.transfers_done, op.gather.chunk, op.gather.phase,
                                       op.gather.finals_done, op.gather.exchanged, op.local.offset, op.local.copied);
    if (p == CrossNode::Progress::kWaiting) return false;
    if (p == CrossNode::Progress::kDone) {
      complete_front(front);
      moved = true;
      return true;
    }
    // Another node's rank that ended is a remote failure; ranks out of step, a mismatch.
    failure_status_ = p == CrossNode::Progress::kMismatch ? ZERO_ERR_MISMATCH : ZERO_ERR_REMOTE;
    // A rank of this node that died, else a peer's own words where it said why it stopped, name the cause.
    std::string stopped = stopped_peer(front->coll.sequence, front->coll.label, true);
    if (stopped.empty()) stopped = cross_->stopped_peer(front->coll.sequence, front->coll.label, true);
    failure_ = !stopped.empty()
                   ? stopped
                   : "collective #" + std::to_string(front->coll.sequence) + " (" + front->coll.label + "): " +
                         (p == CrossNode::Progress::kMismatch ? "the ranks are not in the same collective: " : "") +
                         cross_->error();
    failure_sequence_ = front->coll.sequence;
    failure_label_ = front->coll.label;
    if (stopped_peer(failure_sequence_, failure_label_, true).empty())
      segment_.stop(ShmRankState::kStopped, completed_.load(), failure_);
    cross_->tell_peers(completed_.load(), failure_);
    return false;
  }

  // Jobs over several nodes: this rank's column link (its counterparts on the other nodes, over TCP), checked to
  // cut collectives the same way everywhere.
  void connect_nodes(const std::string& name, int node, int nodes, const ShmNodes& setup, double timeout_s) {
    const int locals = setup.ranks_per_node, local = rank() % locals;
    std::vector<std::string> column;
    for (int n = 0; n < nodes; ++n) column.push_back(setup.addresses[static_cast<size_t>(n * locals + local)]);
    auto link = std::make_unique<TcpColumnLink>(*setup.listener, node, nodes, column,
                                                name + "/column-" + std::to_string(local), timeout_s);
    // Every rank of the column must have the same chunk buffers and node size, or the nodes would exchange
    // chunks that do not match.
    const uint64_t mine[2] = {window_->half_bytes(), static_cast<uint64_t>(locals)};
    std::vector<uint64_t> theirs(2 * static_cast<size_t>(nodes));
    std::vector<ColumnLink::Request> requests;
    for (int n = 0; n < nodes; ++n) {
      if (n == node) continue;
      requests.push_back(ColumnLink::kNoRequest);
      link->send(mine, sizeof mine, n, &requests.back());
      requests.push_back(ColumnLink::kNoRequest);
      link->receive(&theirs[2 * static_cast<size_t>(n)], sizeof mine, n, &requests.back());
    }
    const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                             std::chrono::duration<double>(std::max(0.0, timeout_s)));
    for (ColumnLink::Request& r : requests) {
      size_t got = 0;
      ColumnLink::Test t;
      while ((t = link->test(&r, &got)) == ColumnLink::Test::kPending && Clock::now() < deadline)
        std::this_thread::sleep_for(std::chrono::microseconds(100));
      if (t == ColumnLink::Test::kPending)
        fail(ZERO_ERR_TIMEOUT, "setting up the communicator across nodes: a column peer did not answer in time");
      if (t != ColumnLink::Test::kDone)
        fail(ZERO_ERR_REMOTE, "setting up the communicator across nodes: " + link->error());
    }
    for (int n = 0; n < nodes; ++n)
      if (n != node &&
          (theirs[2 * static_cast<size_t>(n)] != mine[0] || theirs[2 * static_cast<size_t>(n) + 1] != mine[1]))
        fail(ZERO_ERR_MISMATCH,
             "node " + std::to_string(n) + " has " + std::to_string(theirs[2 * static_cast<size_t>(n) + 1]) +
                 " ranks and chunk buffers of " + std::to_string(theirs[2 * static_cast<size_t>(n)]) +
                 " bytes, this node " + std::to_string(mine[1]) + " and " + std::to_string(mine[0]) +
                 " (ZERO_SHM_HALF_BYTES must be the same on every node)");
    cross_ = std::make_unique<CrossNode>(window_, std::move(link), node, nodes);
    cross_->answer_with([this](uint64_t sequence) { return describe_machine(sequence); });
  }

  // After a failure nothing more completes here (the engine stops using the communicator); the buffers stay the
  // engine's, the descriptors are kept until the communicator goes.
  void abandon(const std::string& why) {
    std::lock_guard<std::mutex> lock(queue_mutex_);
    queue_.clear();
    if (failure_.empty()) {  // a later wait, for an earlier collective, fails at once too
      failure_ = why;
      failure_status_ = ZERO_ERR_REMOTE;
    }
  }
  void forget(Op* op) {
    for (auto it = ops_.begin(); it != ops_.end(); ++it)
      if (it->get() == op) {
        ops_.erase(it);
        return;
      }
  }

  void start_progress_thread() {
    if (progress_thread_.joinable()) return;
    try {
      progress_thread_ = std::thread([this] { progress_loop(); });
    } catch (const std::system_error&) {
      use_progress_thread_ = false;  // a container's thread limit: the waits move the queue
    }
  }

  // Moves the queue while the caller computes; when peers are behind it backs off from spinning to short sleeps,
  // so that an idle job costs no core.
  void progress_loop() {
    int idle = 0;
    auto polled = Clock::now();
    std::unique_lock<std::mutex> lock(queue_mutex_);
    while (!stop_progress_) {
      // While it moves a collective the caller does not wait for, it also answers the other machines' questions.
      if (cross_ && !queue_.empty() && Clock::now() - polled > std::chrono::milliseconds(10)) {
        cross_->poll();
        polled = Clock::now();
      }
      if (queue_.empty() || !failure_.empty() || aborted_here_.load()) {
        idle = 0;
        queue_cv_.wait(lock);
        continue;
      }
      if (step_locked()) {
        idle = 0;
        continue;
      }
      ++idle;
      if (idle < 64) {
        lock.unlock();
        std::this_thread::yield();
        lock.lock();
      } else {  // a new collective wakes it at once
        queue_cv_.wait_for(lock, std::chrono::microseconds(idle < 1024 ? 20 : 500));
      }
    }
  }

  void stop_progress_thread() {
    if (!progress_thread_.joinable()) return;
    {
      std::lock_guard<std::mutex> lock(queue_mutex_);
      stop_progress_ = true;
    }
    queue_cv_.notify_one();
    progress_thread_.join();
  }

  ShmSegment segment_;
  std::shared_ptr<NodeWindow> window_;
  std::unique_ptr<CrossNode> cross_;  // a job over several nodes
  std::mutex queue_mutex_;
  std::condition_variable queue_cv_;
  std::deque<Op*> queue_;  // started, not moved through yet, in start order (the same on every rank)
  std::string failure_;    // a descriptor mismatch or a failed read: every later wait fails with it
  zero_status_t failure_status_ = ZERO_ERR_MISMATCH;
  uint64_t failure_sequence_ = 0;  // the collective failure_ is about, and its label
  std::string failure_label_;
  // Every collective started and not yet reported done by a wait (prefetches nobody waits for, failed ones),
  // freed with the communicator. Only the caller's thread adds and removes.
  std::list<std::unique_ptr<Op>> ops_;
  std::atomic<uint64_t> completed_{0};
  std::atomic<bool> aborted_here_{false};
  pid_t owner_;  // the rank's process (a forked child inherits the communicator but is no rank)
  bool use_progress_thread_ = false;
  bool stop_progress_ = false;
  std::thread progress_thread_;
};

}  // namespace

std::shared_ptr<Communicator> make_shm_communicator(const std::string& name, int rank, int size, double join_timeout_s,
                                                    const ShmNodes* nodes) {
  if (nodes != nullptr) {
    const int locals = nodes->ranks_per_node;
    if (locals < 1 || size % locals != 0)
      fail(ZERO_ERR_INVALID_ARGUMENT, "ranks_per_node " + std::to_string(locals) + " does not divide the job's " +
                                          std::to_string(size) + " ranks");
    if (nodes->listener == nullptr || nodes->addresses.size() != static_cast<size_t>(size))
      fail(ZERO_ERR_INVALID_ARGUMENT, "a job over several nodes needs this rank's listener and every rank's address");
    if (locals == size) nodes = nullptr;  // one node after all
  }
  return std::make_shared<ShmCommunicator>(name, rank, size, join_timeout_s, nodes);
}

}  // namespace zero
