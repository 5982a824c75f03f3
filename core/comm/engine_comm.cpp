#include "comm/engine_comm.hpp"

#include <algorithm>
#include <climits>
#include <cstring>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>
#include <utility>

#include "config/config.hpp"
#include "util/test_hooks.hpp"

namespace zero {
namespace {

const char* call_name(CallKind kind) {
  switch (kind) {
    case CallKind::kFinalize:
      return "zero_engine_finalize";
    case CallKind::kGather:
      return "zero_gather";
    case CallKind::kReduceBucket:
      return "a gradient bucket reduction (zero_grad_ready or zero_backward_end)";
    case CallKind::kBackwardEnd:
      return "zero_backward_end";
    case CallKind::kStep:
      return "zero_step";
    case CallKind::kSaveCheckpoint:
      return "zero_save_checkpoint";
    case CallKind::kLoadCheckpoint:
      return "zero_load_checkpoint";
    case CallKind::kCommFinalize:
      return "zero_comm_finalize";
    case CallKind::kPrefetch:
      return "zero_prefetch";
  }
  return "an unknown call";
}

std::string format_seconds(double s) {
  std::ostringstream os;
  os.precision(s < 10 ? 2 : 0);
  os << std::fixed << s;
  return os.str();
}

}  // namespace

std::string describe_call(const CallTag& tag) {
  std::ostringstream os;
  os << call_name(tag.kind);
  switch (tag.kind) {
    case CallKind::kGather:
      os << " of unit " << tag.id << " (" << tag.count << " elements)";
      break;
    case CallKind::kPrefetch:
      os << " of unit " << tag.id << (tag.count ? " (starts an all-gather)" : " (already fetched ahead)");
      break;
    case CallKind::kReduceBucket:
      if (tag.id < 0)
        os << ": bucket " << -tag.id - 1 << " again, for gradients that came after its reduction (" << tag.count
           << " elements)";
      else
        os << ": bucket " << tag.id << " (" << tag.count << " elements)";
      break;
    case CallKind::kBackwardEnd:
      os << " ending micro-step " << tag.id;
      break;
    case CallKind::kStep:
      os << " for optimizer step " << tag.id << " after " << tag.count << " micro-steps";
      break;
    case CallKind::kSaveCheckpoint:
    case CallKind::kLoadCheckpoint:
      os << " (phase " << tag.id << ")";
      break;
    default:
      break;
  }
  return os.str();
}

void finalize_communicator(const std::shared_ptr<Communicator>& comm) {
  const char* call = "zero_comm_finalize";
  if (comm->finalized()) fail(ZERO_ERR_INVALID_STATE, "zero_comm_finalize: the communicator is already finalized");
  std::unique_ptr<Error> local;
  try {
    test_hooks::maybe_fail("comm_finalize", comm->rank());
  } catch (const Error& e) {
    local = std::make_unique<Error>(e);
  }
  EngineComm agreement(comm);
  agreement.set_timeout(timeout_from_environment(agreement.timeout()));
  try {
    agreement.agree(call, CallTag{CallKind::kCommFinalize, 0, 0, 0}, local.get());
  } catch (const Error& e) {
    // A failed exchange leaves the ranks' collective sequences apart: the communicator cannot be used again.
    if (agreement.failed()) comm->abort("zero_comm_finalize failed: " + std::string(e.what()));
    throw;
  }
  comm->finalize();
}

EngineComm::EngineComm(std::shared_ptr<Communicator> comm) : comm_(std::move(comm)) { records_.resize(kRecords); }

void EngineComm::count(Counter counter, uint64_t bytes, uint64_t wire_bytes) {
  stats_.sequence += 1;
  CommKindStats* k = nullptr;
  switch (counter) {
    case Counter::kAllGather:
      k = &stats_.all_gather;
      break;
    case Counter::kReduceScatter:
      k = &stats_.reduce_scatter;
      break;
    case Counter::kAllReduce:
      k = &stats_.all_reduce;
      break;
    case Counter::kBroadcast:
      k = &stats_.broadcast;
      break;
    case Counter::kControl:
      k = &stats_.control;
      break;
    case Counter::kNone:
      return;
  }
  k->calls += 1;
  k->bytes += bytes;
  k->wire_bytes += wire_bytes;
}

size_t EngineComm::record_start(const Collective& c) {
  std::lock_guard<std::mutex> lock(records_mutex_);
  const size_t slot = records_written_++ % kRecords;
  Record& r = records_[slot];
  r.sequence = c.sequence;
  r.kind = c.kind;
  r.type = c.type;
  r.count = c.count;
  r.label = c.label;
  r.state = 0;
  r.start_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - epoch_).count();
  r.duration_s = 0;
  return slot;
}

void EngineComm::record_end(size_t slot, uint64_t sequence, int state) {
  std::lock_guard<std::mutex> lock(records_mutex_);
  Record& r = records_[slot];
  if (r.sequence != sequence) return;  // overwritten meanwhile
  r.state = state;
  r.duration_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - epoch_).count() - r.start_s;
}

std::string EngineComm::recent_json() const {
  std::lock_guard<std::mutex> lock(records_mutex_);
  nlohmann::json out = nlohmann::json::array();
  const uint64_t n = std::min<uint64_t>(records_written_, kRecords);
  for (uint64_t i = records_written_ - n; i < records_written_; ++i) {
    const Record& r = records_[i % kRecords];
    const char* states[3] = {"waiting", "done", "failed"};
    out.push_back({{"sequence", r.sequence},
                   {"kind", coll_kind_name(r.kind)},
                   {"label", r.label},
                   {"count", r.count},
                   {"dtype", elem_type_name(r.type)},
                   {"state", states[r.state]},
                   {"start_s", r.start_s},
                   {"duration_s", r.duration_s}});
  }
  return out.dump(1);
}

// Start, then wait (below). A failure to start leaves the sequences apart on this rank: the engine breaks.
EngineComm::Pending EngineComm::start(Collective c, Counter counter, uint64_t bytes, uint64_t wire_bytes) {
  count(counter, bytes, wire_bytes);
  Pending p;
  p.begin_ = std::chrono::steady_clock::now();
  try {
    p.request_ = comm_->start(c);
  } catch (const Error& e) {
    record_end(record_start(c), c.sequence, 2);
    failed_ = true;
    fail(e.status(), c.label + ": " + e.what());
  }
  // From here the collective runs in the backend: whatever fails in the bookkeeping, its buffer stays protected.
  try {
    p.slot_ = record_start(c);
    p.c_ = std::move(c);
  } catch (...) {
    failed_ = abandoned_ = true;
    throw;
  }
  p.owner_ = this;
  p.active_ = true;
  return p;
}

// Waits in slices until done or past the deadline. On a timeout the request stays in flight inside the backend
// (no backend can cancel a collective), so its buffer must outlive the engine: abandoned_.
void EngineComm::wait(Pending& p) {
  if (!p.active_) fail(ZERO_ERR_INTERNAL, "a collective was waited for twice");
  p.active_ = false;
  const Collective& c = p.c_;
  if (p.request_ == nullptr) {
    record_end(p.slot_, c.sequence, 1);
    return;
  }
  const auto deadline = p.begin_ + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                       std::chrono::duration<double>(timeout_s_));
  try {
    for (;;) {
      const double left = std::chrono::duration<double>(deadline - std::chrono::steady_clock::now()).count();
      if (left <= 0) break;
      if (comm_->wait(p.request_, std::min(left, 0.25))) {
        record_end(p.slot_, c.sequence, 1);
        return;
      }
      // zero_engine_abort from another thread: return now even if the backend would keep waiting.
      if (comm_->aborted())
        fail(ZERO_ERR_ABORTED, "the communicator was aborted on this rank (" + comm_->abort_reason() + ")");
    }
  } catch (const Error& e) {
    record_end(p.slot_, c.sequence, 2);
    failed_ = abandoned_ = true;  // a failed wait may leave the backend's request (and our buffer) in flight
    fail(e.status(), c.label + ": " + e.what());
  } catch (...) {
    record_end(p.slot_, c.sequence, 2);
    failed_ = abandoned_ = true;
    throw;
  }
  record_end(p.slot_, c.sequence, 2);
  failed_ = abandoned_ = true;
  std::string what = c.label + ": collective #" + std::to_string(c.sequence) + " (" + coll_kind_name(c.kind) + " of " +
                     std::to_string(c.count) + " " + elem_type_name(c.type) + ") did not complete within " +
                     format_seconds(timeout_s_) + " s (libzero.timeout_s / ZERO_TIMEOUT_S)";
  // The others get a few seconds to answer: a tenth of the timeout, between half a second and three.
  const std::string diagnosis = comm_->diagnose(c.sequence, std::min(3.0, std::max(0.5, timeout_s_ / 10)));
  if (!diagnosis.empty()) what += ". " + diagnosis;
  comm_->abort("it timed out after " + format_seconds(timeout_s_) + " s waiting in collective #" +
               std::to_string(c.sequence) + " (" + c.label + ")");
  fail(ZERO_ERR_TIMEOUT, what);
}

bool EngineComm::try_wait(Pending& p, double seconds) {
  if (!p.active_) return true;
  const Collective& c = p.c_;
  if (p.request_ == nullptr) {
    p.active_ = false;
    record_end(p.slot_, c.sequence, 1);
    return true;
  }
  const auto deadline =
      std::chrono::steady_clock::now() +
      std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(seconds));
  try {
    for (;;) {
      const double left = std::chrono::duration<double>(deadline - std::chrono::steady_clock::now()).count();
      if (left <= 0 || comm_->aborted()) return false;
      if (comm_->wait(p.request_, std::min(left, 0.25))) {
        p.active_ = false;
        record_end(p.slot_, c.sequence, 1);
        return true;
      }
    }
  } catch (...) {
    // Given up: its buffer is the caller's to keep (ParameterStore leaks exactly those); the engine's other
    // buffers are not in flight and may be freed.
    p.active_ = false;
    record_end(p.slot_, c.sequence, 2);
    failed_ = true;
    return false;
  }
}

void EngineComm::run(Collective c, Counter counter, uint64_t bytes, uint64_t wire_bytes) {
  Pending p = start(std::move(c), counter, bytes, wire_bytes);
  wait(p);
}

void EngineComm::wait_all(std::vector<Pending>& pendings) {
  // After a failure the rest stay in flight in the backend: their buffers must never be freed.
  for (Pending& p : pendings)
    if (p.active_) wait(p);
}

std::vector<EngineComm::Pending> EngineComm::start_group(std::vector<Planned> group) {
  std::vector<Pending> pendings;
  pendings.reserve(group.size());
  comm_->group_begin();
  try {
    for (Planned& g : group) pendings.push_back(start_data(g.kind, g.buf, g.block, g.type, g.label));
  } catch (...) {
    comm_->group_end();
    if (!pendings.empty()) abandoned_ = failed_ = true;  // started ones may still write into their buffers
    throw;
  }
  comm_->group_end();
  return pendings;
}

namespace {

Collective collective(CollKind kind, void* buf, size_t count, ElemType type, std::string label) {
  Collective c;
  c.kind = kind;
  c.type = type;
  c.buf = buf;
  c.count = count;
  c.label = std::move(label);
  return c;
}

}  // namespace

// All-gathers and reduce-scatters move (N-1)/N of the N blocks per rank, whichever algorithm runs them.
EngineComm::Pending EngineComm::start_data(CollKind kind, void* buf, size_t block, ElemType type,
                                           const std::string& label) {
  if (kind != CollKind::kAllGather && kind != CollKind::kReduceScatter)
    fail(ZERO_ERR_INTERNAL, label + ": only all-gathers and reduce-scatters start without waiting");
  const uint64_t block_bytes = block * elem_size(type), n = size();
  return start(collective(kind, buf, block, type, label),
               kind == CollKind::kAllGather ? Counter::kAllGather : Counter::kReduceScatter, block_bytes * n,
               block_bytes * (n - 1));
}

EngineComm::Pending EngineComm::start_all_gather(void* buf, size_t block, ElemType type, const std::string& label) {
  return start_data(CollKind::kAllGather, buf, block, type, label);
}

EngineComm::Pending EngineComm::start_reduce_scatter_sum(void* buf, size_t block, ElemType type,
                                                         const std::string& label) {
  return start_data(CollKind::kReduceScatter, buf, block, type, label);
}

void EngineComm::all_gather(void* buf, size_t block, ElemType type, const std::string& label) {
  Pending p = start_all_gather(buf, block, type, label);
  wait(p);
}

void EngineComm::reduce_scatter_sum(void* buf, size_t block, ElemType type, const std::string& label) {
  Pending p = start_reduce_scatter_sum(buf, block, type, label);
  wait(p);
}

void EngineComm::all_reduce_sum(void* buf, size_t n_elems, ElemType type, const std::string& label) {
  const size_t n = static_cast<size_t>(size());
  if (n_elems % n != 0) fail(ZERO_ERR_INTERNAL, label + ": all_reduce_sum of a length not divisible by the ranks");
  const size_t block = n_elems / n;
  const uint64_t bytes = n_elems * elem_size(type);
  // Ring all-reduce: a reduce-scatter and an all-gather, each sending (N-1)/N of the buffer. Rounded down.
  count(Counter::kAllReduce, bytes, 2 * bytes * (n - 1) / n);
  run(collective(CollKind::kReduceScatter, buf, block, type, label + " (reduce-scatter half)"), Counter::kNone, 0, 0);
  run(collective(CollKind::kAllGather, buf, block, type, label + " (all-gather half)"), Counter::kNone, 0, 0);
}

void EngineComm::broadcast(void* buf, size_t n_elems, ElemType type, int root, const std::string& label) {
  const uint64_t n = size(), bytes = n_elems * elem_size(type);
  Collective c = collective(CollKind::kBroadcast, buf, n_elems, type, label);
  c.root = root;
  run(std::move(c), Counter::kBroadcast, bytes, bytes * (n - 1) / n);
}

namespace {

// A buffer a collective left in flight: the backend may still write into it, so it is never freed, and stays
// reachable from here for the life of the process (a leak checker sees it kept, not lost).
void keep_forever(std::unique_ptr<char[]> buffer) {
  static std::mutex mutex;
  static std::vector<char*>* const kept = new std::vector<char*>();
  std::lock_guard<std::mutex> lock(mutex);
  kept->push_back(buffer.release());
}

}  // namespace

void EngineComm::run_control(Collective c, size_t total_bytes, uint64_t bytes, uint64_t wire_bytes) {
  void* const caller = c.buf;
  if (control_staging_bytes_ < total_bytes || control_staging_ == nullptr) {
    control_staging_.reset(new char[std::max<size_t>(total_bytes, 64)]);
    control_staging_bytes_ = std::max<size_t>(total_bytes, 64);
  }
  if (total_bytes != 0) std::memcpy(control_staging_.get(), caller, total_bytes);
  c.buf = control_staging_.get();
  try {
    run(std::move(c), Counter::kControl, bytes, wire_bytes);
  } catch (...) {
    if (abandoned_) keep_forever(std::move(control_staging_)), control_staging_bytes_ = 0;
    throw;
  }
  if (total_bytes != 0) std::memcpy(caller, control_staging_.get(), total_bytes);
}

void EngineComm::control_min(int64_t* values, size_t n, const std::string& label) {
  Collective c = collective(CollKind::kAllReduce, values, n, ElemType::kI64, label);
  c.op = ReduceOp::kMin;
  run_control(std::move(c), n * 8, n * 8,
              2 * n * 8 * static_cast<uint64_t>(size() - 1) / static_cast<uint64_t>(size()));
}

void EngineComm::control_all_gather(void* buf, size_t block_bytes, const std::string& label) {
  const uint64_t total = block_bytes * static_cast<uint64_t>(size());
  run_control(collective(CollKind::kAllGather, buf, block_bytes, ElemType::kU8, label), total, total,
              block_bytes * static_cast<uint64_t>(size() - 1));
}

void EngineComm::control_broadcast(void* buf, size_t n_bytes, int root, const std::string& label) {
  Collective c = collective(CollKind::kBroadcast, buf, n_bytes, ElemType::kU8, label);
  c.root = root;
  run_control(std::move(c), n_bytes, n_bytes,
              n_bytes * static_cast<uint64_t>(size() - 1) / static_cast<uint64_t>(size()));
}

std::string EngineComm::broadcast_text(const std::string& text, int root, const std::string& label) {
  int64_t length = static_cast<int64_t>(text.size());
  control_broadcast(&length, sizeof length, root, label + " (length)");
  std::string out = rank() == root ? text : std::string(static_cast<size_t>(length), '\0');
  if (length > 0) control_broadcast(&out[0], static_cast<size_t>(length), root, label);
  return out;
}

double EngineComm::sum_over_ranks(double local, const std::string& label) {
  // A small fixed buffer covers the common case without allocating; more ranks take the heap.
  double stack[64];
  std::vector<double> heap;
  const size_t n = static_cast<size_t>(size());
  double* all = stack;
  if (n > 64) heap.resize(n), all = heap.data();
  all[rank()] = local;
  control_all_gather(all, sizeof(double), label);
  double sum = 0.0;
  for (size_t r = 0; r < n; ++r) sum += all[r];
  return sum;
}

// The exchange: one all-reduce (MIN) of [failed rank, then each compared field and its negation], so one call
// yields the minimum and the maximum of every field. Equal minimum and maximum means every rank agrees.
void EngineComm::agree(const char* call, const CallTag& tag, const Error* local_error,
                       const ExplainCheck& explain_check, bool share_status) {
  enum { kFailed, kSeq, kSeqNeg, kKind, kKindNeg, kId, kIdNeg, kCount, kCountNeg, kCheck, kCheckNeg, kN };
  const int64_t sequence = static_cast<int64_t>(comm_->issued() + 1);
  int64_t v[kN];
  v[kFailed] = local_error != nullptr ? rank() : INT64_MAX;
  v[kSeq] = sequence, v[kSeqNeg] = -sequence;
  v[kKind] = static_cast<int64_t>(tag.kind), v[kKindNeg] = -v[kKind];
  v[kId] = tag.id, v[kIdNeg] = -tag.id;
  v[kCount] = tag.count, v[kCountNeg] = -tag.count;
  v[kCheck] = tag.check, v[kCheckNeg] = -tag.check;
  control_min(v, kN, std::string(call) + ": agreement before moving data");

  if (v[kFailed] != INT64_MAX) {
    const int root = static_cast<int>(v[kFailed]);
    // Its status and which call it was in (the others may have reached this agreement from another call).
    int64_t status_and_kind[2] = {local_error != nullptr ? local_error->status() : 0, static_cast<int64_t>(tag.kind)};
    control_broadcast(status_and_kind, sizeof status_and_kind, root, std::string(call) + ": the failed rank's status");
    const std::string message =
        broadcast_text(local_error != nullptr ? local_error->what() : "", root, std::string(call) + ": its message");
    if (local_error != nullptr) throw *local_error;
    const zero_status_t status = static_cast<zero_status_t>(status_and_kind[0]);
    if (share_status) fail(status, "rank " + std::to_string(root) + ": " + message);
    fail(ZERO_ERR_REMOTE, "rank " + std::to_string(root) + " failed in " +
                              call_name(static_cast<CallKind>(status_and_kind[1])) + " (" + status_name(status) +
                              "): " + message);
  }
  const bool same_call =
      v[kSeq] == -v[kSeqNeg] && v[kKind] == -v[kKindNeg] && v[kId] == -v[kIdNeg] && v[kCount] == -v[kCountNeg];
  if (same_call && v[kCheck] == -v[kCheckNeg]) return;
  if (same_call && explain_check) fail(ZERO_ERR_MISMATCH, explain_check());

  // Which rank calls what: everyone's tag, for one message that every rank prints alike.
  int64_t mine[5] = {sequence, static_cast<int64_t>(tag.kind), tag.id, tag.count, tag.check};
  std::vector<int64_t> all(5 * static_cast<size_t>(size()));
  std::memcpy(all.data() + 5 * rank(), mine, sizeof mine);
  control_all_gather(all.data(), sizeof mine, std::string(call) + ": the ranks' calls, to explain a divergence");
  std::ostringstream os;
  os << "ranks diverged: they are not making the same collective call (the program runs different code on "
        "different ranks): ";
  for (int r = 0; r < size(); ++r) {
    const int64_t* t = all.data() + 5 * r;
    CallTag other{static_cast<CallKind>(t[1]), t[2], t[3], t[4]};
    os << (r ? "; " : "") << "rank " << r << " is in " << describe_call(other);
    if (t[0] != sequence) os << " as its collective #" << t[0];
    if (same_call) os << " with check value " << t[4];
  }
  os << ". Every rank must make the same collective calls in the same order; this engine is unusable now";
  fail(ZERO_ERR_MISMATCH, os.str());
}

}  // namespace zero
